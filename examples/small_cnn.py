"""A model of your own, from scratch: what `model.name: examples/small_cnn.py:build` trains.

scaleout calls ``build(input_shape, num_classes)`` inside the engine's model scope and trains what it returns:
an uncompiled tf_keras model of float32 images (already normalized by scaleout) to ``num_classes`` logits (no
softmax). scaleout compiles it: SGD with momentum, the LR scaled and warmed up, weight decay on the kernels,
label smoothing and mixed precision as the config says (docs/your-model.md).
"""

import tf_keras as keras


def build(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for filters in (32, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization(momentum=0.9)(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.MaxPool2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="small_cnn")
