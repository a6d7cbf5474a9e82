"""data: the input stage. Dataset sources (TFDS, ImageNet TFRecords, synthetic) and per-rank sharding
(sources), decoding and augmentation (preprocess), the tf.data pipeline (pipeline), and `app data
imagenet-to-tfrecord`, the converter that prepares ImageNet with the parallel shard writer it shares
(convert), reading the raw ILSVRC tree (ilsvrc).

May import: app.core, app.engines (to agree step counts across ranks). Must not import: training, cluster,
study, reports, cli.
"""
