"""What a registered dataset is: its :class:`DatasetSpec`, the ``DATASETS`` registry, the
arrays a reader returns and the errors a load raises.

The specs themselves are in :mod:`oneshotfl.data.catalog`; loading is
:mod:`oneshotfl.data.datasets`, which imports the catalog, so the registry is full wherever
it is reached through that module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oneshotfl.registry import Registry

#: ``x_train, y_train, x_test, y_test``: uint8 images ``[N, C, H, W]`` (or ``[N, H, W]``) and
#: int64 labels.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class DatasetNotFoundError(FileNotFoundError):
    """The dataset's files are in none of the places searched."""


class DatasetFormatError(ValueError):
    """The dataset's files exist but are not in the expected format."""


@dataclass(frozen=True)
class DatasetSpec:
    """How to find, read and normalise one dataset.

    Attributes:
        name: registry name.
        files: the files needed, each as its accepted names (the first that exists is used).
        read: turns the located files (one path per entry of ``files``) into arrays.
        image_shape: ``(C, H, W)`` every image must have.
        mean: per-channel mean of the [0, 1]-scaled pixels.
        std: per-channel standard deviation of the [0, 1]-scaled pixels.
        class_names: one name per class, in label order.
        hint: how to get the data, ending a not-found message.
        subdirs: subfolders of each search directory to look in (``""``: the directory itself).
        system_dirs: directories searched after ``root`` and ``$ONESHOTFL_DATA``.
        torchvision_class: the ``torchvision.datasets`` class that downloads it, if any.
    """

    name: str
    files: tuple[tuple[str, ...], ...]
    read: Callable[[Sequence[Path]], Arrays]
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]
    hint: str
    subdirs: tuple[str, ...] = ("",)
    system_dirs: tuple[str, ...] = ()
    torchvision_class: str | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


DATASETS: Registry[DatasetSpec] = Registry("dataset")
