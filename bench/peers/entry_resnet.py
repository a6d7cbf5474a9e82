"""The built-in ResNet-20 reached through the user-model entry point.

`model.name: bench/peers/entry_resnet.py:build` builds the same layers as `model.name: resnet20`, as a user's
function, wrapped by app.training.usermodel."""

from app.training.models import create_model


def build(input_shape, num_classes):
    return create_model("resnet20", num_classes, tuple(input_shape), weight_decay=0.0)
