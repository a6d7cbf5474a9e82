"""data: the input stage. What a source is (base); dataset sources (TFDS, ImageNet TFRecords, synthetic) and
per-rank sharding (sources); a researcher's own input function (usersource); decoding and augmentation
(preprocess), the tf.data pipeline (pipeline), and the converters to the standard TFRecord layout: the shared
writer and `app data imagenet-to-tfrecord` (convert, reading ilsvrc), `app data folder-to-tfrecord` (folders).

May import: app.core, app.engines (to agree step counts across ranks). Must not import: training, cluster,
study, reports, cli.
"""
