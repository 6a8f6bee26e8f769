"""One copy of a dataset per machine: loaded once, written once, memory-mapped by every process.

Flower's simulation engine plays the virtual clients in Ray workers, one process per CPU,
beside the ServerApp's process; each used to load the dataset and normalise it into memory
of its own. :func:`load_shared` writes the loaded, normalised arrays once into a folder
(``<folder>/<key>/``: ``.npy`` files and ``meta.json``, written to a temporary folder and
renamed into place, so a process never sees a half-written copy and two processes that race
both end with the same files) and every process maps them (``mmap_mode='c'``: pages come
from the operating system's page cache, held once however many processes read them, and a
write — none is made — would stay private to its process).

The key hashes the dataset's name, the files it was read from (path, size, modification
time) and the normalisation, so a changed file or a new version of the loader is a new copy.
Only registered datasets are shared; a user's ``npz:``/``csv:``/``folder:`` data loads as
before (:func:`~oneshotfl.data.datasets.load_dataset`).

The folder: the ``shared_data`` argument, else ``$ONESHOTFL_SHARED_DATA``, else
``<temp>/oneshotfl-shared-data-<uid>``; ``"off"`` turns sharing off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from oneshotfl.data.datasets import DATASETS, load_dataset, locate, search_dirs
from oneshotfl.data.types import Dataset, LabelledData
from oneshotfl.data.user import is_user_spec

log = logging.getLogger(__name__)

SHARED_ENV = "ONESHOTFL_SHARED_DATA"
FORMAT = 1
"""The layout of a shared copy; a change makes new copies."""
_ARRAYS = ("train_x", "train_y", "test_x", "test_y")


def shared_folder(explicit: str | None = None) -> Path | None:
    """Where shared copies live (see the module docs); ``None`` when sharing is off."""
    value = explicit if explicit is not None else os.environ.get(SHARED_ENV)
    if value == "off":
        return None
    if value:
        return Path(value).expanduser()
    return Path(tempfile.gettempdir()) / f"oneshotfl-shared-data-{os.getuid()}"


def shared_key(name: str, root: str | None) -> str | None:
    """The key of ``name``'s shared copy, from its files; ``None`` for data that is not
    shared (a user's spec) or whose files are not found (the loader then says so)."""
    if is_user_spec(name) or name not in DATASETS:
        return None
    spec = DATASETS.get(name)
    if root and spec.files and not Path(root).expanduser().is_dir():
        return None
    paths = locate(spec, search_dirs(spec, root))
    if paths is None:
        return None
    digest = hashlib.sha256(json.dumps([FORMAT, name, spec.mean, spec.std]).encode())
    for path in paths:
        stat = path.stat()
        digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{name}-{digest.hexdigest()[:16]}"


def load_shared(
    name: str, root: str | None = None, download: bool = False, folder: Path | None = None
) -> Dataset:
    """``name`` as :func:`~oneshotfl.data.datasets.load_dataset` gives it, memory-mapped from
    the machine's shared copy (made first when there is none); loaded as usual when
    ``folder`` is ``None`` or the data is not shared."""
    key = None if folder is None else shared_key(name, root)
    if folder is None or key is None:
        return load_dataset(name, root, download)
    target = folder / key
    if not (target / "meta.json").is_file():
        dataset = load_dataset(name, root, download)
        try:
            _write(dataset, target)
        except OSError as exc:  # a folder that cannot be written: this process's own copy
            log.warning("no shared copy of %s in %s (%s): loaded into this process", name,
                        folder, exc)  # fmt: skip
            return dataset
    return _open(target)


def _write(dataset: Dataset, target: Path) -> None:
    """Write ``dataset`` to ``target`` atomically (a racing writer's copy is as good)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        arrays = (dataset.train.x, dataset.train.y, dataset.test.x, dataset.test.y)
        for array_name, tensor in zip(_ARRAYS, arrays, strict=True):
            np.save(scratch / f"{array_name}.npy", tensor.numpy())
        meta = {"name": dataset.name, "num_classes": dataset.num_classes}
        (scratch / "meta.json").write_text(json.dumps(meta | {"classes": dataset.class_names}))
        scratch.chmod(0o755)
        try:
            scratch.rename(target)
            log.info("shared copy of %s written to %s", dataset.name, target)
        except OSError:  # another process put its copy there first
            if not (target / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _open(target: Path) -> Dataset:
    """The shared copy at ``target``, memory-mapped."""
    meta = json.loads((target / "meta.json").read_text())
    t = {n: torch.from_numpy(np.load(target / f"{n}.npy", mmap_mode="c")) for n in _ARRAYS}
    return Dataset(
        meta["name"],
        LabelledData(t["train_x"], t["train_y"]),
        LabelledData(t["test_x"], t["test_y"]),
        int(meta["num_classes"]),
        tuple(meta["classes"]),
    )
