"""The two-hidden-layer perceptron of McMahan et al. (2017).

Reference:
    H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas. "Communication-Efficient
    Learning of Deep Networks from Decentralized Data." AISTATS 2017 (the "2NN": two hidden
    layers of 200 units with ReLU; 199,210 parameters on MNIST).
"""

from __future__ import annotations

import torch
from torch import nn

from oneshotfl.models.base import MODELS, ClassifierModel


class MLP(ClassifierModel):
    """Fully connected network: flatten → (Linear → ReLU) per hidden layer → linear head.

    Args:
        in_channels: channels of the input images.
        num_classes: outputs of the head.
        image_size: side length of the square input images.
        hidden: widths of the hidden layers; ``num_features`` is the last one.
    """

    unnormalised = True

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        hidden: tuple[int, ...] = (200, 200),
    ) -> None:
        super().__init__(in_channels, num_classes, image_size)
        if not hidden or any(h < 1 for h in hidden):
            raise ValueError(f"MLP expects at least one positive hidden width, got {hidden}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = self.in_channels * self.image_size * self.image_size
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        self.features = nn.Sequential(*layers)
        self.num_features = width
        self.head = nn.Linear(width, self.num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.features(x)
        return out


@MODELS.register("mlp", "2-hidden-layer MLP (200-200, ReLU), McMahan et al. 2017")
def mlp(in_channels: int, num_classes: int, image_size: int) -> MLP:
    """The McMahan et al. (2017) 2NN: hidden layers of 200 and 200 units."""
    return MLP(in_channels, num_classes, image_size, hidden=(200, 200))


@MODELS.register("head_mlp", "classifier head on embeddings: d → 128 → C (FedAGE's Classifier 1)")
def head_mlp(in_channels: int, num_classes: int, image_size: int) -> MLP:
    """A light head for ``[N, d]`` embeddings (build with ``in_channels=d, image_size=1``)."""
    return MLP(in_channels, num_classes, image_size, hidden=(128,))


@MODELS.register("head_mlp2", "classifier head on embeddings: d → 128 → 32 → C (Classifier 2)")
def head_mlp2(in_channels: int, num_classes: int, image_size: int) -> MLP:
    """FedAGE's Classifier 2 (Appendix B.2)."""
    return MLP(in_channels, num_classes, image_size, hidden=(128, 32))


@MODELS.register("head_mlp3", "classifier head on embeddings: d → 128 → 32 → 16 → C (Classifier 3)")
def head_mlp3(in_channels: int, num_classes: int, image_size: int) -> MLP:
    """FedAGE's Classifier 3 (Appendix B.2)."""
    return MLP(in_channels, num_classes, image_size, hidden=(128, 32, 16))
