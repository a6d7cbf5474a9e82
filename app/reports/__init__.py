"""reports: tables, plots and CSV files from what training, benchmarks and studies wrote.

`app report` (app_report, with benchmarks and runs: scaling tables, training curves, time to accuracy), the
scaling study's report (scaling: RQ1 + RQ2), CSC's gpularge test in both (csc, csc_section), the
large-batch study's report (large_batch, with large_batch_runs, large_batch_verdicts and paired: RQ3), and
the writers they share (tables).

May import: app.core, app.engines.diagnostics.timeline (reading a trace), app.study (a study's plan and
state). Never imports TensorFlow or Horovod: reports are made on a login node.
"""
