"""CIFAR-style residual networks of He et al. (2016).

Reference:
    K. He, X. Zhang, S. Ren, J. Sun. "Deep Residual Learning for Image Recognition." CVPR 2016,
    Section 4.2 (the CIFAR-10 networks: a 3x3 stem of 16 channels, three stages of ``n`` basic
    blocks with 16, 32 and 64 channels, the last two starting with stride 2, global average
    pooling and a linear classifier; depth ``6n + 2``).

Layouts (basic blocks per stage):

* ``resnet8``: [1, 1, 1] (depth 6·1 + 2).
* ``resnet11``: [2, 1, 1]. No ``6n + 2`` network has depth 11; this library's choice is one
  extra block in the first stage, which gives 11 convolutions: the stem, eight 3x3 convolutions
  in the four blocks and the two 1x1 projection shortcuts.
* ``resnet20``: [3, 3, 3] (depth 6·3 + 2).
* ``resnet56``: [9, 9, 9] (depth 6·9 + 2).

Where a block changes resolution or width, its shortcut is a 1x1 convolution with batch
normalisation (the paper's option B); elsewhere it is the identity. ``num_features`` is 64.
The stem keeps the input resolution, so any ``image_size >= 4`` works (8x8 digits end in a 2x2
map, 96x96 STL-10 images in 24x24, both globally average-pooled).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from oneshotfl.models.base import MODELS, ClassifierModel, init_conv_bn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection.

    Args:
        in_planes: input channels.
        planes: output channels.
        stride: stride of the first convolution (and of the projection shortcut).
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(ClassifierModel):
    """CIFAR-style ResNet: 3x3 stem → three stages of basic blocks → global average pool → head.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        image_size: side length of the square input images (at least 4: two stride-2 stages).
        blocks: basic blocks in each stage.
        widths: channels of the stem and of each stage (the stem uses the first stage's).
    """

    min_image_size = 4

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        blocks: Sequence[int] = (3, 3, 3),
        widths: Sequence[int] = (16, 32, 64),
    ) -> None:
        super().__init__(in_channels, num_classes, image_size)
        if len(blocks) != len(widths) or not blocks or any(b < 1 for b in blocks):
            raise ValueError(
                "ResNet expects one positive block count per stage width, "
                f"got blocks={tuple(blocks)} and widths={tuple(widths)}"
            )
        self.conv1 = nn.Conv2d(self.in_channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages: list[nn.Module] = []
        in_planes = widths[0]
        for i, (n, planes) in enumerate(zip(blocks, widths, strict=True)):
            stage: list[nn.Module] = []
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                stage.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
            stages.append(nn.Sequential(*stage))
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = in_planes
        self.head = nn.Linear(in_planes, self.num_classes)
        init_conv_bn(self)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layers(out)
        return torch.flatten(self.pool(out), 1)


@MODELS.register("resnet8", "CIFAR ResNet-8 (blocks [1,1,1], 16/32/64 ch), He et al. 2016")
def resnet8(in_channels: int, num_classes: int, image_size: int) -> ResNet:
    """CIFAR-style ResNet-8."""
    return ResNet(in_channels, num_classes, image_size, blocks=(1, 1, 1))


@MODELS.register("resnet11", "CIFAR ResNet-11 (blocks [2,1,1], 16/32/64 ch), He et al. 2016")
def resnet11(in_channels: int, num_classes: int, image_size: int) -> ResNet:
    """CIFAR-style ResNet-11 (this library's [2, 1, 1] layout)."""
    return ResNet(in_channels, num_classes, image_size, blocks=(2, 1, 1))


@MODELS.register("resnet20", "CIFAR ResNet-20 (blocks [3,3,3], 16/32/64 ch), He et al. 2016")
def resnet20(in_channels: int, num_classes: int, image_size: int) -> ResNet:
    """CIFAR-style ResNet-20."""
    return ResNet(in_channels, num_classes, image_size, blocks=(3, 3, 3))


@MODELS.register("resnet56", "CIFAR ResNet-56 (blocks [9,9,9], 16/32/64 ch), He et al. 2016")
def resnet56(in_channels: int, num_classes: int, image_size: int) -> ResNet:
    """CIFAR-style ResNet-56."""
    return ResNet(in_channels, num_classes, image_size, blocks=(9, 9, 9))
