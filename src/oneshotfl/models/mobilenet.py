"""CIFAR-style MobileNetV2 (Sandler et al., 2018).

Reference:
    M. Sandler, A. Howard, M. Zhu, A. Zhmoginov, L.-C. Chen. "MobileNetV2: Inverted Residuals
    and Linear Bottlenecks." CVPR 2018 (Table 2: a 32-channel 3x3 stem, seven stages of
    inverted-residual bottlenecks ``(t, c, n, s)``, a 1x1 convolution to 1280 channels, global
    average pooling and a linear classifier).

Small-image adaptation (as in common CIFAR ports): the stem and the second stage use stride 1
instead of 2, so the network down-samples by 8 instead of 32 (32x32 inputs end in a 4x4 map,
8x8 digits in 1x1; ``image_size >= 8``). The width multiplier scales every channel count
(rounded to a multiple of 8), and the last convolution keeps ``1280 * max(1, width)`` channels
as in the paper. The registered ``mobilenetv2`` uses width 1.0; there is no dropout before the
head, so that the head stays a single linear layer.
"""

from __future__ import annotations

import torch
from torch import nn

from oneshotfl.models.base import MODELS, ClassifierModel, init_conv_bn

# (expansion t, output channels c, repeats n, stride s of the first repeat); Table 2 of the
# paper with the second stage's stride set to 1 for small images.
CIFAR_SETTINGS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to the nearest multiple of ``divisor``, losing no more than 10%."""
    out = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if out < 0.9 * value:
        out += divisor
    return out


def _conv_bn_relu6(
    in_planes: int, planes: int, kernel: int, stride: int = 1, groups: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(
            in_planes, planes, kernel, stride, padding=kernel // 2, groups=groups, bias=False
        ),
        nn.BatchNorm2d(planes),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """Expand (1x1) → depthwise 3x3 → linear projection (1x1), residual when shapes match.

    Args:
        in_planes: input channels.
        planes: output channels.
        stride: stride of the depthwise convolution.
        expansion: ratio of hidden to input channels.
    """

    def __init__(self, in_planes: int, planes: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = in_planes * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(_conv_bn_relu6(in_planes, hidden, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, planes, 1, bias=False),
            nn.BatchNorm2d(planes),
        ]
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_planes == planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(x)
        return x + out if self.use_residual else out


class MobileNetV2(ClassifierModel):
    """MobileNetV2 with a stride-1 stem for small images.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        image_size: side length of the square input images (at least 8: three stride-2 stages).
        width: width multiplier applied to every layer's channels.

    ``num_features`` is the width of the last 1x1 convolution (1280 for ``width <= 1``).
    """

    min_image_size = 8

    def __init__(
        self, in_channels: int, num_classes: int, image_size: int, width: float = 1.0
    ) -> None:
        super().__init__(in_channels, num_classes, image_size)
        if not width > 0:
            raise ValueError(f"MobileNetV2 expects a positive width multiplier, got {width}")
        self.width = float(width)
        in_planes = make_divisible(32 * width)
        layers: list[nn.Module] = [_conv_bn_relu6(self.in_channels, in_planes, 3, 1)]
        for t, c, n, s in CIFAR_SETTINGS:
            planes = make_divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(in_planes, planes, s if i == 0 else 1, t))
                in_planes = planes
        last = make_divisible(1280 * max(1.0, width))
        layers.append(_conv_bn_relu6(in_planes, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = last
        self.head = nn.Linear(last, self.num_classes)
        init_conv_bn(self, head=self.head, head_std=0.01)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(self.features(x)), 1)


@MODELS.register("mobilenetv2", "CIFAR-style MobileNetV2 (width 1.0), Sandler et al. 2018")
def mobilenetv2(in_channels: int, num_classes: int, image_size: int) -> MobileNetV2:
    """MobileNetV2 with width multiplier 1.0."""
    return MobileNetV2(in_channels, num_classes, image_size, width=1.0)
