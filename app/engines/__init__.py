"""engines: everything that scaling out adds. Starting and joining the workers, the distributed optimizer,
collectives, the stop agreement and the watchdog, the local launcher (`--np N`), Slurm's ranks joined through
Horovod's Gloo rendezvous, Horovod's timeline, and the checks `app doctor` and `app info` run.

Today one engine, Horovod (lines that exist only for it are marked ``[horovod]``); a second one goes beside it
behind the same functions. Training code calls these and never imports Horovod itself.

May import: app.core. Must not import: data, training, cluster, study, reports, cli. Horovod and TensorFlow
are imported inside the functions that need them, never at module level.
"""
