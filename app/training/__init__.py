"""training: models, the learning-rate schedule, a run's sizes (plan), what every stage sets up first
(prepare), checkpoints, rank-0 output, the callbacks, the training loop (train), evaluation and `app
benchmark`. The models know no ranks or devices; whatever distribution adds comes from app.engines.

May import: app.core, app.engines, app.data. Must not import: cluster, study, reports, cli.
"""
