"""A small VGG-style network (Simonyan & Zisserman, 2015).

Reference:
    K. Simonyan, A. Zisserman. "Very Deep Convolutional Networks for Large-Scale Image
    Recognition." ICLR 2015 (stacks of 3x3 convolutions with max-pooling, then fully connected
    layers). Batch normalisation after each convolution follows S. Ioffe, C. Szegedy, "Batch
    Normalization", ICML 2015.

This library's ``vgg`` is a VGG-9-style network scaled down for small images, in the spirit of
the VGG-9 used in federated learning benchmarks (Wang et al., "Federated Learning with Matched
Averaging", ICLR 2020):

    conv3x3 32 → pool → conv3x3 64 → pool → conv3x3 128 → conv3x3 128 → pool
    → average-pool to at most 2x2 → flatten → FC 256 → ReLU → head

Every convolution is followed by batch norm and ReLU; pools are 2x2 max-pools. That is five
weighted layers before the head, six with it. ``num_features`` is 256. The three pools need
``image_size >= 8`` (8x8 digits reach the FC layer as a 1x1 map, 28x28 and larger as 2x2).
"""

from __future__ import annotations

import torch
from torch import nn

from oneshotfl.models.base import MODELS, ClassifierModel, capped_pool, init_conv_bn

# Channels of the 3x3 convolutions; "M" is a 2x2 max-pool.
VGG_SMALL: tuple[int | str, ...] = (32, "M", 64, "M", 128, 128, "M")


class VGG(ClassifierModel):
    """VGG-style classifier: 3x3 conv/BN/ReLU stacks with max-pools, one hidden FC layer, head.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        image_size: side length of the square input images (at least 8, and at least
            ``2 ** pools`` for a custom ``config``).
        config: conv widths and ``"M"`` for max-pools.
        hidden: width of the fully connected layer before the head.
        max_map: largest spatial side fed to the fully connected layer.
    """

    min_image_size = 8

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        config: tuple[int | str, ...] = VGG_SMALL,
        hidden: int = 256,
        max_map: int = 2,
    ) -> None:
        super().__init__(in_channels, num_classes, image_size)
        pools = sum(1 for c in config if c == "M")
        if self.image_size < 2**pools:
            raise ValueError(
                f"VGG with {pools} max-pools expects image_size >= {2**pools}, "
                f"got {self.image_size}"
            )
        layers: list[nn.Module] = []
        planes = self.in_channels
        side = self.image_size
        for c in config:
            if c == "M":
                layers.append(nn.MaxPool2d(2))
                side //= 2
            else:
                width = int(c)
                layers += [
                    nn.Conv2d(planes, width, 3, padding=1, bias=False),
                    nn.BatchNorm2d(width),
                    nn.ReLU(inplace=True),
                ]
                planes = width
        pool, side = capped_pool(side, max_map)
        layers += [pool, nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Sequential(nn.Linear(planes * side * side, hidden), nn.ReLU(inplace=True))
        self.num_features = hidden
        self.head = nn.Linear(hidden, self.num_classes)
        init_conv_bn(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.features(x))
        return out


@MODELS.register("vgg", "small VGG-9-style CNN (conv 32-64-128-128 + BN, FC 256), VGG 2015")
def vgg(in_channels: int, num_classes: int, image_size: int) -> VGG:
    """Small VGG-9-style network."""
    return VGG(in_channels, num_classes, image_size)
