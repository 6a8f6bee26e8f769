"""The dataset registry: Fashion-MNIST (the default), MNIST, CIFAR-10/100, SVHN, STL-10, digits.

Every loader returns a :class:`~oneshotfl.data.types.Dataset` whose images are ``float32``
tensors ``[N, C, H, W]`` and labels ``int64`` ``[N]``. Pixels are scaled to [0, 1] and then
normalised per channel, ``(x − mean) / std``, with these fixed constants (the usual training-
set statistics of each dataset; digits: of the whole set, rounded):

=============  ==========================  ==========================
dataset        mean                        std
=============  ==========================  ==========================
fashion_mnist  0.2860                      0.3530
mnist          0.1307                      0.3081
cifar10        0.4914, 0.4822, 0.4465      0.2470, 0.2435, 0.2616
cifar100       0.5071, 0.4865, 0.4409      0.2673, 0.2564, 0.2762
svhn           0.4377, 0.4438, 0.4728      0.1980, 0.2010, 0.1970
stl10          0.4467, 0.4398, 0.4066      0.2603, 0.2566, 0.2713
digits         0.3                         0.38
=============  ==========================  ==========================

Files are looked for in the ``root`` argument, then ``$ONESHOTFL_DATA``, then the system
location (only Fashion-MNIST has one: Debian's ``dataset-fashion-mnist`` package installs
``/usr/share/datasets/fashion-mnist``); within each directory also in the subfolders that
torchvision and common layouts use. Earlier directories win. Nothing is downloaded unless
``download=True``, which lets the matching torchvision class fetch the files into ``root``
(else ``$ONESHOTFL_DATA``, else ``./data``) and then reads them with the readers here.

Besides registered names, :func:`load_dataset` takes the user's own data as a spec,
``folder:path=DIR`` (an image folder), ``npz:path=FILE`` or ``csv:path=FILE`` (a table; see
:mod:`oneshotfl.data.user`).
What a registered dataset is (:class:`DatasetSpec`, ``DATASETS``, the errors) is
:mod:`oneshotfl.data.dataset_spec`; the built-in datasets are :mod:`oneshotfl.data.catalog`,
imported here so the registry is full.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from oneshotfl.data import catalog as _catalog  # noqa: F401  (importing registers the datasets)
from oneshotfl.data.dataset_spec import (
    DATASETS,
    Arrays,
    DatasetFormatError,
    DatasetNotFoundError,
    DatasetSpec,
)
from oneshotfl.data.types import Dataset, LabelledData
from oneshotfl.data.user import is_user_spec, load_user_dataset

log = logging.getLogger(__name__)

#: The environment variable naming a data directory searched after ``root``.
DATA_ENV = "ONESHOTFL_DATA"


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
    return DATASETS.names()


def search_dirs(spec: DatasetSpec, root: str | Path | None) -> list[Path]:
    """The directories searched for ``spec``, in order: ``root``, ``$ONESHOTFL_DATA``, system.

    Args:
        spec: the dataset.
        root: the caller's directory, if any.
    """
    dirs = [Path(root).expanduser()] if root else []
    env = os.environ.get(DATA_ENV)
    if env:
        dirs.append(Path(env).expanduser())
    dirs += [Path(d) for d in spec.system_dirs]
    return list(dict.fromkeys(dirs))  # de-duplicated, order kept


def load_dataset(name: str, root: str | Path | None = None, download: bool = False) -> Dataset:
    """Load a registered dataset, or the user's ``folder:path=DIR``, ``npz:path=FILE`` or
    ``csv:path=FILE`` (:mod:`oneshotfl.data.user`), into memory, normalised.

    Args:
        name: registry name (see :func:`list_datasets`), or a ``folder:``/``npz:``/``csv:`` spec.
        root: a directory to look in first (and to download into); not used by a spec.
        download: when the files are nowhere, fetch them with torchvision (needs a network;
            fashion_mnist, mnist, cifar10, cifar100, svhn and stl10 only); not used by a spec.

    Returns:
        The train and test splits as ``float32`` ``[N, C, H, W]`` images and ``int64`` labels.

    Raises:
        RegistryError: for an unknown name.
        DatasetNotFoundError: when the files are nowhere (the message says where it looked
            and how to get them), or a download failed.
        DatasetFormatError: (a ``ValueError``) when files exist but are corrupt; the message
            names the file, what was expected and what was found.
    """
    if is_user_spec(name):
        return load_user_dataset(name)
    spec = DATASETS.get(name)
    if root and spec.files and not download and not Path(root).expanduser().is_dir():
        raise DatasetNotFoundError(
            f"data root {root}: expected an existing directory holding {name}, got none "
            "(leave data_root unset to use $ONESHOTFL_DATA or the system copy)"
        )
    dirs = search_dirs(spec, root)
    paths = locate(spec, dirs)
    if paths is None and download and spec.torchvision_class is not None:
        target = Path(root or os.environ.get(DATA_ENV) or "data").expanduser()
        _download(spec, target, dirs)
        paths = locate(spec, [target])
    if paths is None:
        raise DatasetNotFoundError(_not_found_message(spec, dirs))
    log.debug("loading %s from %s", name, paths[0].parent if paths else "(built in)")
    x_train, y_train, x_test, y_test = _read(spec, paths)
    return Dataset(
        name,
        _labelled(x_train, y_train, spec, "train"),
        _labelled(x_test, y_test, spec, "test"),
        spec.num_classes,
        spec.class_names,
    )


def locate(spec: DatasetSpec, dirs: Sequence[Path]) -> list[Path] | None:
    """The paths of ``spec``'s files in the first folder that holds all of them, else ``None``.

    Folders are tried directory by directory (earlier directories win), and within one
    directory in the order of ``spec.subdirs``.
    """
    if not spec.files:
        return []
    for base in dirs:
        for sub in spec.subdirs:
            folder = base / sub if sub else base
            found = [_first_file(folder, names) for names in spec.files]
            if all(p is not None for p in found):
                return [p for p in found if p is not None]
    return None


def _first_file(folder: Path, names: Sequence[str]) -> Path | None:
    for n in names:
        if (folder / n).is_file():
            return folder / n
    return None


def _not_found_message(spec: DatasetSpec, dirs: Sequence[Path]) -> str:
    if dirs:
        where = ", ".join(str(d) for d in dirs)
        subs = [f"{s}/" for s in spec.subdirs if s]
        if subs:
            owner = "their" if len(dirs) > 1 else "its"
            plural = "s" if len(subs) > 1 else ""
            where += f" and {owner} subfolder{plural} {', '.join(subs)}"
    else:
        where = f"no directory (none given and ${DATA_ENV} unset)"
    wanted = _file_label(spec.files[0]) if spec.files else "its files"
    return (
        f"dataset {spec.name!r} not found: looked for {wanted} and the other files of its "
        f"layout in {where}; to get it, {spec.hint}"
    )


def _file_label(names: Sequence[str]) -> str:
    """``a[.gz]`` for a file accepted compressed or raw, else the first accepted name."""
    if len(names) == 2 and names[0] == f"{names[1]}.gz":
        return f"{names[1]}[.gz]"
    return names[0]


def _download(spec: DatasetSpec, target: Path, dirs: Sequence[Path]) -> None:  # pragma: no cover
    import torchvision.datasets as tvd

    log.info("downloading %s into %s with torchvision", spec.name, target)
    cls = getattr(tvd, str(spec.torchvision_class))
    try:
        if spec.name in ("svhn", "stl10"):
            for split in ("train", "test"):
                cls(str(target), split=split, download=True)
        else:
            for train in (True, False):
                cls(str(target), train=train, download=True)
    except Exception as exc:  # no network, a checksum mismatch, a full disk, ...
        raise DatasetNotFoundError(
            f"{_not_found_message(spec, dirs)}; downloading it into {target} failed: {exc}"
        ) from exc


def _read(spec: DatasetSpec, paths: Sequence[Path]) -> Arrays:
    try:
        return spec.read(paths)
    except (ValueError, pickle.UnpicklingError) as exc:
        raise DatasetFormatError(f"dataset {spec.name!r}: {exc}") from None


def _labelled(x: np.ndarray, y: np.ndarray, spec: DatasetSpec, split: str) -> LabelledData:
    """Check shape and label range, scale to [0, 1], normalise per channel."""
    if x.ndim == 3:
        x = x[:, None]
    if tuple(x.shape[1:]) != spec.image_shape:
        raise DatasetFormatError(
            f"dataset {spec.name!r} {split}: expected images of shape {spec.image_shape}, "
            f"got {tuple(x.shape[1:])}"
        )
    if len(y) and (y.min() < 0 or y.max() >= spec.num_classes):
        raise DatasetFormatError(
            f"dataset {spec.name!r} {split}: expected labels in 0..{spec.num_classes - 1}, "
            f"got {y.min()}..{y.max()}"
        )
    images = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
    images.sub_(torch.tensor(spec.mean, device=images.device).view(1, -1, 1, 1))
    images.div_(torch.tensor(spec.std, device=images.device).view(1, -1, 1, 1))
    return LabelledData(images, torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64)))
