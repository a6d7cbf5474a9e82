"""engines.launch: starting the workers.

The local launcher of `app train --np N` (``local.py``: horovodrun with its rendezvous on loopback, or the tf
engine's one process) and Slurm's ranks joined through Horovod's Gloo rendezvous (``rendezvous.py``).

May import: app.core and the engines. Must not import: data, training, cluster, study, reports, cli.
"""
