"""engines: everything that scaling out adds. Starting and joining the workers, the distributed optimizer,
collectives, the stop agreement and the watchdog, the local launcher (`--np N`), Slurm's ranks joined through
Horovod's Gloo rendezvous, Horovod's timeline, and the checks `app doctor` and `app info` run.

Two engines, Horovod (``horovod.py``) and TensorFlow's own strategies (``tfdist.py``), each a class
implementing the typed contract ``engine.Engine``. Training code calls the engine in use
(``engine.current()``) and never imports Horovod itself.

May import: app.core. Must not import: data, training, cluster, study, reports, cli. Horovod and TensorFlow
are imported inside the functions that need them, never at module level.
"""
