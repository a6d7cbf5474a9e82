"""reports: tables, plots and CSV files from what training, benchmarks and studies wrote. `app report`
(scaling tables, training curves, time to accuracy), the scaling study's report (RQ1 + RQ2), the large-batch
study's report (RQ3), and the writers they share.

May import: app.core, app.engines.diagnostics.timeline (reading a trace), app.study (a study's plan and
state). Never imports TensorFlow or Horovod: reports are made on a login node.
"""
