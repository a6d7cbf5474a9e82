"""study: a research question of the reference study as one command.

Plans (which runs, with which overrides, on how many workers: large_batch, scaling, with dataset counting the
training examples), the study folder and its files (folder, files), its state (state), and the executors that
run a plan locally (executor, local) or as Slurm jobs (slurm).

May import: app.core, app.cluster, of app.engines only world (launcher detection) and of app.training only
the schedule's arithmetic (tests/test_architecture.py holds it to that). Never imports TensorFlow or Horovod:
`app study status` and `--cluster` run on a login node.
"""
