"""The registered datasets: their files, readers, shapes, normalisation constants and class
names (the table is in :mod:`oneshotfl.data.datasets`). Importing this module registers them
in :data:`~oneshotfl.data.dataset_spec.DATASETS`; :mod:`oneshotfl.data.datasets` does so when it
is imported."""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from oneshotfl.data.dataset_spec import DATASETS, Arrays, DatasetSpec
from oneshotfl.data.formats import (
    cifar_arrays,
    read_cifar_batch,
    read_idx_split,
    read_stl10,
    read_svhn_mat,
)

# --------------------------------------------------------------------------- readers

_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_IDX_FILES = tuple((f"{s}.gz", s) for s in _IDX_STEMS)


def _read_idx(paths: Sequence[Path]) -> Arrays:
    return (*read_idx_split(paths[0], paths[1]), *read_idx_split(paths[2], paths[3]))


_CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


def _read_cifar(label_key: str) -> Callable[[Sequence[Path]], Arrays]:
    """A reader of CIFAR batches: every path but the last is train, the last is test."""

    def read(paths: Sequence[Path]) -> Arrays:
        splits = []
        for group in (paths[:-1], paths[-1:]):
            pairs = [cifar_arrays(read_cifar_batch(p), p, label_key) for p in group]
            splits += [np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])]
        return splits[0], splits[1], splits[2], splits[3]

    return read


def _read_svhn(paths: Sequence[Path]) -> Arrays:
    return (*read_svhn_mat(paths[0]), *read_svhn_mat(paths[1]))


def _read_stl10(paths: Sequence[Path]) -> Arrays:
    return (*read_stl10(paths[0], paths[1]), *read_stl10(paths[2], paths[3]))


#: The fixed seed of the digits train/test split; never tied to experiment seeds.
DIGITS_SPLIT_SEED = 20_250_101
#: The share of each digits class held out for test.
DIGITS_TEST_FRACTION = 0.2


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits`` gives them (images 0..16, targets), read from
    the file scikit-learn ships without importing scikit-learn (its import, with SciPy's and
    pandas', costs about a second, paid by every Flower node and ServerApp process); through
    ``load_digits`` where that file is not where scikit-learn keeps it."""
    spec = importlib.util.find_spec("sklearn")
    roots = [] if spec is None else list(spec.submodule_search_locations or [])
    for root in roots:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


def _read_digits(paths: Sequence[Path]) -> Arrays:
    """scikit-learn's 8×8 digits, 0..16 scaled to 0..255; a fixed stratified 80/20 split.

    Per class, a permutation drawn from ``default_rng(DIGITS_SPLIT_SEED)`` puts the first
    ``round(0.2·n_c)`` examples in test: 1438 train / 359 test, the same on every call.
    """
    images, target = _digits_arrays()
    x = np.rint(images * (255.0 / 16.0)).astype(np.uint8)
    y = target.astype(np.int64)
    rng = np.random.default_rng(DIGITS_SPLIT_SEED)
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: round(DIGITS_TEST_FRACTION * len(idx))]] = True
    return x[~test], y[~test], x[test], y[test]


# --------------------------------------------------------------------------- registrations

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
#: CIFAR-100's fine label names in label order (as in the ``meta`` file, which is not needed).
_CIFAR100_NAMES = """
    apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo
    keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain
    mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain
    plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk
    skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank
    telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf
    woman worm
"""
_CIFAR100 = tuple(_CIFAR100_NAMES.split())
_STL10 = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")


def _register(spec: DatasetSpec, description: str) -> None:
    DATASETS.register(spec.name, description)(spec)


_register(
    DatasetSpec(
        "fashion_mnist",
        _IDX_FILES,
        _read_idx,
        (1, 28, 28),
        (0.2860,),
        (0.3530,),
        _FASHION,
        "run `apt-get install -y dataset-fashion-mnist`, or pass --data-root DIR holding the "
        "four IDX files (train-images-idx3-ubyte.gz, ...), or add --download",
        subdirs=("", "fashion_mnist", "fashion-mnist", "FashionMNIST/raw"),
        system_dirs=("/usr/share/datasets/fashion-mnist",),
        torchvision_class="FashionMNIST",
    ),
    "Fashion-MNIST, 28×28 grey, 10 classes, 60k/10k (IDX files; the default)",
)
_register(
    DatasetSpec(
        "mnist",
        _IDX_FILES,
        _read_idx,
        (1, 28, 28),
        (0.1307,),
        (0.3081,),
        _DIGITS,
        "pass --data-root DIR holding the four MNIST IDX files (or MNIST/raw/), or add --download",
        subdirs=("", "mnist", "MNIST/raw"),
        torchvision_class="MNIST",
    ),
    "MNIST, 28×28 grey, 10 classes, 60k/10k (IDX files)",
)
_register(
    DatasetSpec(
        "cifar10",
        tuple((n,) for n in (*_CIFAR10_TRAIN, "test_batch")),
        _read_cifar("labels"),
        (3, 32, 32),
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        _CIFAR10,
        "pass --data-root DIR holding cifar-10-batches-py/, or add --download",
        subdirs=("cifar-10-batches-py", ""),
        torchvision_class="CIFAR10",
    ),
    "CIFAR-10, 32×32 RGB, 10 classes, 50k/10k (python batches)",
)
_register(
    DatasetSpec(
        "cifar100",
        (("train",), ("test",)),
        _read_cifar("fine_labels"),
        (3, 32, 32),
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        _CIFAR100,
        "pass --data-root DIR holding cifar-100-python/, or add --download",
        subdirs=("cifar-100-python", ""),
        torchvision_class="CIFAR100",
    ),
    "CIFAR-100, 32×32 RGB, 100 fine classes, 50k/10k (python batches)",
)
_register(
    DatasetSpec(
        "svhn",
        (("train_32x32.mat",), ("test_32x32.mat",)),
        _read_svhn,
        (3, 32, 32),
        (0.4377, 0.4438, 0.4728),
        (0.1980, 0.2010, 0.1970),
        _DIGITS,
        "pass --data-root DIR holding train_32x32.mat and test_32x32.mat, or add --download",
        subdirs=("", "svhn", "SVHN"),
        torchvision_class="SVHN",
    ),
    "SVHN cropped digits, 32×32 RGB, 10 classes, 73k/26k (.mat files)",
)
_register(
    DatasetSpec(
        "stl10",
        (("train_X.bin",), ("train_y.bin",), ("test_X.bin",), ("test_y.bin",)),
        _read_stl10,
        (3, 96, 96),
        (0.4467, 0.4398, 0.4066),
        (0.2603, 0.2566, 0.2713),
        _STL10,
        "pass --data-root DIR holding stl10_binary/, or add --download",
        subdirs=("stl10_binary", ""),
        torchvision_class="STL10",
    ),
    "STL-10 labelled splits, 96×96 RGB, 10 classes, 5k/8k (binary files)",
)
_register(
    DatasetSpec(
        "digits",
        (),
        _read_digits,
        (1, 8, 8),
        (0.3,),
        (0.38,),
        _DIGITS,
        "it ships with scikit-learn; reinstall scikit-learn",
    ),
    "scikit-learn digits, 8×8 grey, 10 classes, fixed 1438/359 split (tiny runs and tests)",
)
