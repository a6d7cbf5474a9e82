"""data: the input stage. Dataset sources (TFDS, ImageNet TFRecords, synthetic), per-rank sharding, decoding
and augmentation in tf.data, and `app data imagenet-to-tfrecord`, the converter that prepares ImageNet.

May import: app.core, app.engines (to agree step counts across ranks). Must not import: training, cluster,
study, reports, cli.
"""
