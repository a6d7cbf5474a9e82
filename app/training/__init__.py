"""training: from a resolved config to a trained, evaluated or benchmarked model.

The built-in models (models) and a researcher's own (usermodel, with her code run by app.core.usercode and the
run's copy of her file in modelcopy), the learning-rate schedule (schedule), a run's sizes (plan), what every
stage sets up first (prepare), checkpoints (checkpoint), one writer per run directory (runlock), rank-0 output
(output), the callbacks (callbacks), the training loop (train), a run's end and summary (finish), evaluation
(evaluate) and `app benchmark` (benchmark). The models know no ranks or devices; whatever distribution adds
comes from app.engines.

May import: app.core, app.engines, app.data. Must not import: cluster, study, reports, cli.
"""
