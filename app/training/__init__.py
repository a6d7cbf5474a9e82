"""training: models, the learning-rate schedule, checkpoints, rank-0 output, the training loop, evaluation and
`app benchmark`. The models know no ranks or devices; whatever distribution adds comes from app.engines.

May import: app.core, app.engines, app.data. Must not import: cluster, study, reports, cli.
"""
