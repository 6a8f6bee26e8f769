"""Small convolutional networks: a LeNet-5-like CNN and the CNN of McMahan et al. (2017).

References:
    Y. LeCun, L. Bottou, Y. Bengio, P. Haffner. "Gradient-Based Learning Applied to Document
    Recognition." Proceedings of the IEEE, 1998 (LeNet-5).
    H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas. "Communication-Efficient
    Learning of Deep Networks from Decentralized Data." AISTATS 2017 (the "CNN": two 5x5
    convolutions with 32 and 64 channels, each followed by 2x2 max-pooling, a 512-unit fully
    connected layer and a softmax output; 1,663,370 parameters on MNIST).

Both networks use "same"-padded 5x5 convolutions, so an input of side ``s`` reaches the fully
connected layers as an ``s // 4`` map. Larger maps are average-pooled down to a cap (5x5 for
``cnn``, as LeNet-5's 16x5x5 layer; 8x8 for ``fedavg_cnn``, leaving the paper's 7x7 on 28x28
MNIST and 8x8 on 32x32 CIFAR untouched) so that 96x96 inputs do not inflate the first fully
connected layer. Both need ``image_size >= 4``.
"""

from __future__ import annotations

import torch
from torch import nn

from oneshotfl.models.base import MODELS, ClassifierModel, capped_pool


class _TwoConvNet(ClassifierModel):
    """conv5x5 → ReLU → maxpool2 → conv5x5 → ReLU → maxpool2 → [avgpool] → FC stack → head.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        image_size: side length of the square input images (at least 4).
        channels: output channels of the two convolutions.
        hidden: widths of the fully connected layers before the head; ``num_features`` is the
            last one.
        max_map: largest spatial side fed to the first fully connected layer.
    """

    min_image_size = 4
    unnormalised = True

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        channels: tuple[int, int],
        hidden: tuple[int, ...],
        max_map: int,
    ) -> None:
        super().__init__(in_channels, num_classes, image_size)
        c1, c2 = channels
        pool, side = capped_pool(self.image_size // 4, max_map)
        self.conv = nn.Sequential(
            nn.Conv2d(self.in_channels, c1, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            pool,
            nn.Flatten(),
        )
        layers: list[nn.Module] = []
        width = c2 * side * side
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        self.fc = nn.Sequential(*layers)
        self.num_features = width
        self.head = nn.Linear(width, self.num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.conv(x))
        return out


class LeNet5(_TwoConvNet):
    """LeNet-5-like CNN: conv 6 → conv 16 (5x5, same padding, max-pool) → FC 120 → 84 → head.

    ``num_features`` is 84. The 16-channel map is average-pooled to at most 5x5 (400 inputs to
    the 120-unit layer, as in LeNet-5); 8x8 inputs give a 2x2 map.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__(
            in_channels, num_classes, image_size, channels=(6, 16), hidden=(120, 84), max_map=5
        )


class FedAvgCNN(_TwoConvNet):
    """McMahan et al. (2017) CNN: conv 32 → conv 64 (5x5, same padding, max-pool) → FC 512.

    ``num_features`` is 512. The 64-channel map is average-pooled to at most 8x8.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__(
            in_channels, num_classes, image_size, channels=(32, 64), hidden=(512,), max_map=8
        )


@MODELS.register("cnn", "LeNet-5-like CNN (conv 6-16, FC 120-84), LeCun et al. 1998")
def cnn(in_channels: int, num_classes: int, image_size: int) -> LeNet5:
    """LeNet-5-like small CNN."""
    return LeNet5(in_channels, num_classes, image_size)


@MODELS.register("fedavg_cnn", "2-conv CNN (32-64 channels, FC 512) of McMahan et al. 2017")
def fedavg_cnn(in_channels: int, num_classes: int, image_size: int) -> FedAvgCNN:
    """The CNN of McMahan et al. (2017)."""
    return FedAvgCNN(in_channels, num_classes, image_size)


class SimpleCNN2(ClassifierModel):
    """FedEOV's SimpleCNN2 (16 kernels): conv5x5 16 (same) → BN → ReLU → maxpool2 → conv5x5 32
    (valid) → BN → ReLU → maxpool2 → FC 120 → BN → ReLU → head. 111,035 parameters for 11
    outputs on 28x28 greyscale images. ``num_features`` is 120. Below 12 pixels the second
    convolution is same-padded (8x8 digits), so ``image_size >= 4`` suffices."""

    min_image_size = 4

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__(in_channels, num_classes, image_size)
        valid = self.image_size >= 12
        side = (self.image_size // 2 - 4) // 2 if valid else self.image_size // 4
        self.conv = nn.Sequential(
            nn.Conv2d(self.in_channels, 16, kernel_size=5, padding=2),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=5, padding=0 if valid else 2),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(32 * side * side, 120), nn.BatchNorm1d(120), nn.ReLU())
        self.num_features = 120
        self.head = nn.Linear(120, self.num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.conv(x))
        return out


@MODELS.register("simple_cnn2", "conv 16-32 with BatchNorm, FC 120 (FedEOV's SimpleCNN2)")
def simple_cnn2(in_channels: int, num_classes: int, image_size: int) -> SimpleCNN2:
    """FedEOV's small CNN with BatchNorm."""
    return SimpleCNN2(in_channels, num_classes, image_size)
