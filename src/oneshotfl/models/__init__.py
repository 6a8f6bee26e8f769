"""The model zoo: small-image classifiers behind one registry.

Every model is a :class:`ClassifierModel` (timm-style ``forward_features`` / ``forward_head``
with a single linear ``head``) built by :func:`create_model` from its registered name::

    model = create_model("resnet20", in_channels=3, num_classes=10, image_size=32)
"""

from oneshotfl.models.base import (
    MODELS,
    ClassifierModel,
    ModelFactory,
    create_model,
    list_models,
)
from oneshotfl.models.cnn import FedAvgCNN, LeNet5
from oneshotfl.models.mlp import MLP
from oneshotfl.models.mobilenet import MobileNetV2
from oneshotfl.models.resnet import ResNet
from oneshotfl.models.vgg import VGG

__all__ = [
    "MLP",
    "MODELS",
    "VGG",
    "ClassifierModel",
    "FedAvgCNN",
    "LeNet5",
    "MobileNetV2",
    "ModelFactory",
    "ResNet",
    "create_model",
    "list_models",
]
