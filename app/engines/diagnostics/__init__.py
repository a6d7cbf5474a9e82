"""engines.diagnostics: what the distributed stack reports about itself.

`app doctor`'s checks and timed all-reduce (``doctor.py``), `app info`'s description of this machine's stack
(``info.py``), GPU utilization sampled during a benchmark (``gpusample.py``) and Horovod's timeline read back
(``timeline.py``).

May import: app.core and the engines. Must not import: data, training, cluster, study, reports, cli.
"""
