"""The data generator of the server-side data-free methods (DENSE, Co-Boosting, IntactOFL).

:class:`ImageGenerator` is the DCGAN-style generator the authors' synthesisers share
(IntactOFL's repository, after DENSE): Linear(nz → 2·ngf·(s/4)²) → BN → ×2 upsample →
conv3×3 → BN → LeakyReLU(0.2) → ×2 upsample → conv3×3 → BN → LeakyReLU(0.2) → conv3×3 →
sigmoid, an image in [0, 1], then normalised with the dataset's per-channel statistics so that
it is an input the clients' models expect. It is unconditional: the label only names the class
the loss asks for. It is not in the classifier registry (:data:`oneshotfl.models.MODELS`):
it maps noise to images, a different kind of model.
"""

from __future__ import annotations

import torch
from torch import nn

from oneshotfl.data.feature_skew import Stats, dataset_stats
from oneshotfl.data.types import TaskInfo

SIDE_MULTIPLE = 4
"""The image side :class:`ImageGenerator` needs a multiple of: it upsamples twice by 2."""


def input_statistics(task: TaskInfo) -> Stats:
    """The per-channel normalisation of the task's inputs: the dataset's, or mean 0.5 and
    std 0.5 when the channel count differs (a colour feature skew paints grey images in RGB
    and normalises them so)."""
    stats = dataset_stats(task.dataset)
    if stats is None or len(stats.mean) != task.in_channels:
        return Stats((0.5,) * task.in_channels, (0.5,) * task.in_channels)
    return stats


class ImageGenerator(nn.Module):
    """Noise ``[B, nz]`` → normalised images ``[B, C, s, s]`` (see the module docs).

    Args:
        noise_dim: nz.
        width: ngf (the authors' 64).
        task: the images' channels, size (a multiple of 4) and normalisation.
        normalise: normalise the [0, 1] output (False: F-DAFL's code feeds it raw).
    """

    def __init__(self, noise_dim: int, width: int, task: TaskInfo, normalise: bool = True) -> None:
        super().__init__()
        if task.image_size % SIDE_MULTIPLE:
            raise ValueError(
                f"ImageGenerator: expected an image size divisible by {SIDE_MULTIPLE}, got "
                f"{task.image_size}"
            )
        self.base = task.image_size // SIDE_MULTIPLE
        self.width = width
        self.project = nn.Sequential(
            nn.Linear(noise_dim, 2 * width * self.base**2), nn.BatchNorm2d(2 * width)
        )
        self.body = nn.Sequential(
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width, task.in_channels, 3, padding=1),
            nn.Sigmoid(),
        )
        stats = input_statistics(task)
        mean, std = (stats.mean, stats.std) if normalise else ((0.0,), (1.0,))
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        linear, norm = self.project[0], self.project[1]
        h = linear(z).view(len(z), 2 * self.width, self.base, self.base)
        return (self.body(norm(h)) - self.mean) / self.std
