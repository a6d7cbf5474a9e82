"""A model of your own around a tf_keras.applications base: MobileNetV3-Small with a new classifier.

`model.name: applications.MobileNetV3Small` trains the architecture as Keras defines it; a file like this one
is for what it does not give: here dropout before the classifier. The base is untrained (weights=None); for
pretrained weights load them from a local file inside ``build`` (scaleout never downloads at run time).
"""

import tf_keras as keras


def build(input_shape, num_classes):
    base = keras.applications.MobileNetV3Small(
        input_shape=input_shape,
        include_top=False,
        weights=None,
        pooling="avg",
        include_preprocessing=False,  # scaleout feeds normalized float images
    )
    x = keras.layers.Dropout(0.2)(base.output)
    return keras.Model(base.input, keras.layers.Dense(num_classes)(x), name="mobilenet_head")
