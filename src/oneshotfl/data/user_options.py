"""What every user dataset reader shares: the spec's options, the errors, the limits checked
before anything is allocated, and the carved test split (see :mod:`oneshotfl.data.user`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from oneshotfl.data.dataset_spec import DatasetFormatError, DatasetNotFoundError
from oneshotfl.params import Params, is_int, require

USER_KINDS = ("folder", "npz", "csv")
#: The fixed seed of carved test splits; never tied to experiment seeds.
USER_SPLIT_SEED = 20_250_301
#: The largest image side accepted (``size``, or an npz image's side).
MAX_SIDE = 1024
#: The most classes an npz file may have (``classes``, or its largest label + 1).
MAX_CLASSES = 100_000
#: The file endings read as images in a folder (compared lower-cased).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})

_COMMON = ("path", "test_fraction", "mean", "std", "max_images")
_OPTIONS = {
    "folder": (*_COMMON, "size", "channels"),
    "npz": (*_COMMON, "classes", "standardise"),
    "csv": (*_COMMON, "classes", "label", "standardise"),
}

#: ``x, y, x_test, y_test, class_names``: ``[N, C, S, S]`` images (uint8 or floats in [0, 1]).
Splits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]


class UserDataError(DatasetFormatError):
    """A ``folder:`` or ``npz:`` dataset whose spec or files are not what they must be."""


class UserDataNotFoundError(DatasetNotFoundError):
    """A ``folder:`` or ``npz:`` dataset whose path does not exist."""


@dataclass(frozen=True)
class UserDataOptions(Params):
    """A user dataset spec's options (see the module docs); ``size`` and ``channels`` are a
    folder's, ``classes`` an npz or CSV file's, ``label`` a CSV file's; ``standardise``
    (tables: per-feature standardisation on the training split, on by default) an npz or
    CSV table's."""

    path: str = ""
    size: int = 32
    channels: int = 3
    classes: int | None = None
    test_fraction: float = 0.2
    mean: float | None = None
    std: float | None = None
    max_images: int = 2_000_000
    label: str | None = None
    standardise: bool = True

    def validate(self) -> None:
        require(bool(self.path), "path", "a file or directory (path=...)", self.path)
        require(is_int(self.size, 1) and self.size <= MAX_SIDE, "size", "1..1024", self.size)
        require(self.channels in (1, 3), "channels", "1 or 3", self.channels)
        ok = self.classes is None or (is_int(self.classes, 1) and self.classes <= MAX_CLASSES)
        require(ok, "classes", f"1..{MAX_CLASSES}", self.classes)
        require(0 < self.test_fraction < 1, "test_fraction", "in (0, 1)", self.test_fraction)
        mean_ok = self.mean is None or math.isfinite(self.mean)
        require(mean_ok, "mean", "a finite number", self.mean)
        std_ok = self.std is None or (math.isfinite(self.std) and self.std > 0)
        require(std_ok, "std", "> 0", self.std)
        require(is_int(self.max_images, 1), "max_images", "an integer >= 1", self.max_images)

    def normalisation(self, table: bool) -> tuple[float, float]:
        """``(mean, std)``: as declared, else 0.5, 0.5 for pixels and 0, 1 for a table."""
        mean = self.mean if self.mean is not None else (0.0 if table else 0.5)
        std = self.std if self.std is not None else (1.0 if table else 0.5)
        return mean, std


def carve_test(y: np.ndarray, fraction: float) -> np.ndarray:
    """The test mask of a carved split: per class in label order, the first
    ``min(round(fraction·n), n − 1)`` of a permutation drawn from :data:`USER_SPLIT_SEED`."""
    rng = np.random.default_rng(USER_SPLIT_SEED)
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: min(round(fraction * len(idx)), len(idx) - 1)]] = True
    return test


def user_error(spec: str, text: str) -> UserDataError:
    """The one-line error of a user dataset: its spec, then what was expected and what came."""
    return UserDataError(f"dataset {spec!r}: {text}")


def check_image_count(spec: str, total: int, opts: UserDataOptions) -> None:
    """Refuse a dataset of no image, or of more than ``max_images``, before any is decoded."""
    if not 1 <= total <= opts.max_images:
        raise user_error(
            spec, f"expected 1..{opts.max_images} images in all (max_images), got {total}"
        )
