"""engines: everything that scaling out adds, in three parts by role.

The engines: Horovod (``horovod.py``) and TensorFlow's own strategies (``tfdist.py``), each a class
implementing the typed contract ``engine.Engine``, with what both share (``devices.py``, ``world.py``,
``faults.py``). Training code calls the engine in use (``engine.current()``) and never imports Horovod itself.
Launching (``launch/``): the local launcher of ``--np N`` and Slurm's ranks joined through Horovod's Gloo
rendezvous. Diagnostics (``diagnostics/``): the checks of `app doctor` and `app info`, GPU sampling and
Horovod's timeline read back.

May import: app.core. Must not import: data, training, cluster, study, reports, cli. Horovod and TensorFlow
are imported inside the functions that need them, never at module level.
"""
