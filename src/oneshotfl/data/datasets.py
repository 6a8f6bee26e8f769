"""The dataset registry: Fashion-MNIST (the default), MNIST, CIFAR-10/100, SVHN, STL-10, digits.

Every loader returns a :class:`~oneshotfl.data.types.Dataset` whose images are normalised
``float32`` tensors ``[N, C, H, W]`` (per-channel mean/std constants below, the usual ones for
each dataset) and labels ``int64``. Nothing is downloaded unless ``download=True``; files are
looked for in the ``root`` argument, then ``$ONESHOTFL_DATA``, then the system location
(Debian's ``dataset-fashion-mnist`` for Fashion-MNIST).
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oneshotfl.data.formats import (
    cifar_images,
    read_cifar_batch,
    read_idx,
    read_stl10,
    read_svhn_mat,
)
from oneshotfl.data.types import Dataset, LabelledData
from oneshotfl.registry import Registry

log = logging.getLogger(__name__)

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, y_train, x_test, y_test


class DatasetNotFoundError(FileNotFoundError):
    """The dataset's files are in none of the places searched."""


class DatasetFormatError(ValueError):
    """The dataset's files exist but are not in the expected format."""


@dataclass(frozen=True)
class DatasetSpec:
    """How to find, read and normalise one dataset."""

    name: str
    read: Callable[[Sequence[Path]], Arrays | None]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]
    hint: str
    system_dirs: tuple[str, ...] = ()
    download: Callable[[Path], None] | None = None


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def _register(spec: DatasetSpec, description: str) -> None:
    DATASETS.register(spec.name, description)(spec)


def list_datasets() -> list[str]:
    """Registered dataset names."""
    return DATASETS.names()


def search_dirs(spec: DatasetSpec, root: str | Path | None) -> list[Path]:
    """Where ``spec`` is looked for, in order."""
    dirs = [Path(root)] if root else []
    if os.environ.get("ONESHOTFL_DATA"):
        dirs.append(Path(os.environ["ONESHOTFL_DATA"]))
    return dirs + [Path(d) for d in spec.system_dirs]


def load_dataset(name: str, root: str | Path | None = None, download: bool = False) -> Dataset:
    """Load a registered dataset.

    Args:
        name: registry name.
        root: a directory to look in first (and to download into).
        download: fetch the files with torchvision when they are missing (needs a network).

    Raises:
        RegistryError: for an unknown name.
        DatasetNotFoundError: when the files are nowhere (the message says where it looked).
        ValueError: when files exist but are corrupt.
    """
    spec = DATASETS.get(name)
    dirs = search_dirs(spec, root)
    arrays = _read(spec, dirs)
    if arrays is None and download and spec.download is not None:
        target = Path(root or os.environ.get("ONESHOTFL_DATA") or "data")
        log.info("downloading %s into %s", name, target)
        spec.download(target)
        arrays = _read(spec, [target])
    if arrays is None:
        looked = ", ".join(str(d) for d in dirs) or "(no directory given)"
        raise DatasetNotFoundError(f"dataset {name!r} not found in {looked}; {spec.hint}")
    x_train, y_train, x_test, y_test = arrays
    return Dataset(
        name,
        _labelled(x_train, y_train, spec),
        _labelled(x_test, y_test, spec),
        len(spec.class_names),
        spec.class_names,
    )


def _read(spec: DatasetSpec, dirs: Sequence[Path]) -> Arrays | None:
    try:
        return spec.read(dirs)
    except (ValueError, KeyError, pickle.UnpicklingError) as exc:
        raise DatasetFormatError(f"dataset {spec.name!r}: {exc}") from None


def _labelled(x: np.ndarray, y: np.ndarray, spec: DatasetSpec) -> LabelledData:
    images = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
    if images.ndim == 3:
        images = images.unsqueeze(1)
    mean = torch.tensor(spec.mean).view(1, -1, 1, 1)
    std = torch.tensor(spec.std).view(1, -1, 1, 1)
    return LabelledData((images - mean) / std, torch.from_numpy(y.astype(np.int64)))


def _first_existing(
    dirs: Sequence[Path], subdirs: Sequence[str], files: Sequence[str]
) -> Path | None:
    for base in dirs:
        for sub in subdirs:
            folder = base / sub
            if all((folder / f).exists() for f in files):
                return folder
    return None


def _idx_reader(subdirs: Sequence[str]) -> Callable[[Sequence[Path]], Arrays | None]:
    stems = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )

    def read(dirs: Sequence[Path]) -> Arrays | None:
        for base in dirs:  # earlier directories win, gzip or raw alike
            for suffix in (".gz", ""):
                folder = _first_existing([base], subdirs, [s + suffix for s in stems])
                if folder is not None:
                    return _read_idx_set(folder, [s + suffix for s in stems])
        return None

    return read


def _read_idx_set(folder: Path, names: Sequence[str]) -> Arrays:
    xtr, ytr, xte, yte = (read_idx(folder / n) for n in names)
    for x, y, split in ((xtr, ytr, "train"), (xte, yte, "test")):
        if len(x) != len(y):
            raise ValueError(f"{folder}: {split} has {len(x)} images but {len(y)} labels")
    return xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)


def _torchvision_download(cls_name: str, **kwargs: object) -> Callable[[Path], None]:
    def download(root: Path) -> None:  # pragma: no cover - needs a network
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        if cls_name in ("SVHN", "STL10"):
            for split in ("train", "test"):
                cls(str(root), split=split, download=True, **kwargs)
        else:
            cls(str(root), train=True, download=True, **kwargs)
            cls(str(root), train=False, download=True, **kwargs)

    return download


def _read_cifar(
    folder_name: str, train: Sequence[str], test: str, label_key: str
) -> Callable[[Sequence[Path]], Arrays | None]:
    def read(dirs: Sequence[Path]) -> Arrays | None:
        folder = _first_existing(dirs, (folder_name, ""), [*train, test])
        if folder is None:
            return None
        out = []
        for names in (train, [test]):
            batches = [read_cifar_batch(folder / n) for n in names]
            x = np.concatenate([cifar_images(b, folder) for b in batches])
            y = np.concatenate([np.asarray(b[label_key], dtype=np.int64) for b in batches])
            out += [x, y]
        return out[0], out[1], out[2], out[3]

    return read


def _read_svhn(dirs: Sequence[Path]) -> Arrays | None:
    folder = _first_existing(dirs, ("", "svhn", "SVHN"), ["train_32x32.mat", "test_32x32.mat"])
    if folder is None:
        return None
    return (*read_svhn_mat(folder / "train_32x32.mat"), *read_svhn_mat(folder / "test_32x32.mat"))


def _read_stl10(dirs: Sequence[Path]) -> Arrays | None:
    names = ["train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"]
    folder = _first_existing(dirs, ("stl10_binary", ""), names)
    if folder is None:
        return None
    return (
        *read_stl10(folder / names[0], folder / names[1]),
        *read_stl10(folder / names[2], folder / names[3]),
    )


#: The fixed seed of the digits train/test split (never tied to experiment seeds).
DIGITS_SPLIT_SEED = 20_250_101


def _read_digits(dirs: Sequence[Path]) -> Arrays:
    """scikit-learn's 8×8 digits, 0..16 scaled to 0..255; a fixed stratified 80/20 split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(DIGITS_SPLIT_SEED)
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: round(0.2 * len(idx))]] = True
    return x[~test], y[~test], x[test], y[test]


_FASHION = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_DIGITS = tuple(str(i) for i in range(10))
_CIFAR10 = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
_STL10 = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")
_CIFAR_MEAN, _CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

_register(
    DatasetSpec(
        "fashion_mnist",
        _idx_reader(("", "fashion_mnist", "fashion-mnist", "FashionMNIST/raw")),
        (0.2860,),
        (0.3530,),
        _FASHION,
        "install it with `apt-get install -y dataset-fashion-mnist`, pass --data-root DIR "
        "holding the four IDX .gz files, or use --download",
        system_dirs=("/usr/share/datasets/fashion-mnist",),
        download=_torchvision_download("FashionMNIST"),
    ),
    "Fashion-MNIST, 28×28 grey, 10 classes, 60k/10k (IDX files; the default)",
)
_register(
    DatasetSpec(
        "mnist",
        _idx_reader(("", "mnist", "MNIST/raw")),
        (0.1307,),
        (0.3081,),
        _DIGITS,
        "pass --data-root DIR holding the four MNIST IDX files (or MNIST/raw), or --download",
        download=_torchvision_download("MNIST"),
    ),
    "MNIST, 28×28 grey, 10 classes, 60k/10k (IDX files)",
)
_register(
    DatasetSpec(
        "cifar10",
        _read_cifar(
            "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels"
        ),
        _CIFAR_MEAN,
        _CIFAR_STD,
        _CIFAR10,
        "pass --data-root DIR holding cifar-10-batches-py/, or --download",
        download=_torchvision_download("CIFAR10"),
    ),
    "CIFAR-10, 32×32 RGB, 10 classes, 50k/10k (python batches)",
)
_register(
    DatasetSpec(
        "cifar100",
        _read_cifar("cifar-100-python", ["train"], "test", "fine_labels"),
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        tuple(f"class_{i}" for i in range(100)),
        "pass --data-root DIR holding cifar-100-python/, or --download",
        download=_torchvision_download("CIFAR100"),
    ),
    "CIFAR-100, 32×32 RGB, 100 fine classes, 50k/10k (python batches)",
)
_register(
    DatasetSpec(
        "svhn",
        _read_svhn,
        (0.4377, 0.4438, 0.4728),
        (0.1980, 0.2010, 0.1970),
        _DIGITS,
        "pass --data-root DIR holding train_32x32.mat and test_32x32.mat, or --download",
        download=_torchvision_download("SVHN"),
    ),
    "SVHN cropped digits, 32×32 RGB, 10 classes, 73k/26k (.mat files)",
)
_register(
    DatasetSpec(
        "stl10",
        _read_stl10,
        (0.4467, 0.4398, 0.4066),
        (0.2603, 0.2566, 0.2713),
        _STL10,
        "pass --data-root DIR holding stl10_binary/, or --download",
        download=_torchvision_download("STL10"),
    ),
    "STL-10 labelled splits, 96×96 RGB, 10 classes, 5k/8k (binary files)",
)
_register(
    DatasetSpec("digits", _read_digits, (0.3,), (0.38,), _DIGITS, "bundled with scikit-learn"),
    "scikit-learn digits, 8×8 grey, 10 classes, fixed 1438/359 split (tiny runs and tests)",
)
