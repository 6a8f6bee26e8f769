"""User-supplied datasets, named wherever a dataset name is by a spec: an image folder,
``folder:path=DIR``, NumPy arrays, ``npz:path=FILE``, or a table in a CSV file,
``csv:path=FILE`` (:mod:`oneshotfl.data.user_csv`), each with ``:key=value`` options.

* ``folder:path=DIR[:size=32][:channels=3]`` — one subfolder per class, labels 0..C−1 in the
  order of the sorted names. When DIR holds ``train/`` and ``test/`` (with the same class
  subfolders) those are the splits, else the test split is carved. Images are the files, in
  nested folders too, ending in .png .jpg .jpeg .bmp .gif .webp .tif .tiff (any case; hidden and
  other files are ignored), read with Pillow, converted to ``L`` (1 channel) or ``RGB`` (3;
  16-bit grey keeps its high byte) and resized to ``size``×``size``, bilinear.
* ``npz:path=FILE[:classes=K]`` — arrays ``x`` and ``y``, optionally ``x_test`` and ``y_test``
  (both or neither; without them the test split is carved). ``x``: images ``[N, H, W]``,
  ``[N, C, H, W]`` or ``[N, H, W, C]`` with C ∈ {1, 3} (channels-first wins where both fit),
  ``uint8`` or floats in [0, 1] — non-square images are padded with zeros, centred, to a
  square of the longer side — or a table ``[N, D]`` of D features, any finite floats (or
  uint8), read as D channels of a 1×1 image (models that need a picture, the CNNs, refuse it
  before training; ``mlp`` takes it); ``y``: integer labels 0..C−1 with each present, C =
  ``classes`` or the largest label + 1. Shapes and dtypes are checked from the headers before
  any array is read; nothing is unpickled.

Both take ``test_fraction`` (0.2: a carved split puts per class the first ``min(round(f·n),
n − 1)`` of a permutation drawn from :data:`USER_SPLIT_SEED` in test, so every party loading the
same files gets the same split), ``mean`` and ``std`` (images 0.5, 0.5; tables 0, 1, their
features as given: the declared normalisation ``(x − mean) / std`` of the [0, 1] pixels or the
features, one value for every channel, so parties normalise alike without seeing each other's
data) and ``max_images`` (2,000,000: more images in all are refused before any is decoded, as
are sides above :data:`MAX_SIDE`). A table (an npz ``[N, D]`` or a CSV file) is standardised
per feature by default: ``(x_j − mean_j) / std_j`` with the mean and standard deviation of
feature j over the training split (after the test split is carved; a constant feature keeps
std 1), applied to both splits — every party that loads the same file computes the same
values; ``standardise=false`` keeps the features as given, and a declared ``mean`` or ``std``
replaces the standardisation. A relative path is
relative to the working directory; ``data_root`` and ``download`` do not apply. Problems
raise :class:`UserDataNotFoundError` (no such path) or :class:`UserDataError`, one sentence
naming the spec and the file.
"""

from __future__ import annotations

import functools
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from oneshotfl.data.types import Dataset, LabelledData
from oneshotfl.data.user_csv import read_csv
from oneshotfl.data.user_npz import MAX_FEATURES, _headers, _layout, _npz_layout, _read_npz
from oneshotfl.data.user_options import (
    _OPTIONS,
    IMAGE_SUFFIXES,
    MAX_CLASSES,
    MAX_SIDE,
    USER_KINDS,
    USER_SPLIT_SEED,
    Splits,
    UserDataError,
    UserDataNotFoundError,
    UserDataOptions,
    carve_test,
    check_image_count,
    user_error,
)
from oneshotfl.params import coerce_params


def is_user_spec(name: str) -> bool:
    """Whether ``name`` is a ``folder:`` or ``npz:`` spec rather than a registry name."""
    return isinstance(name, str) and name.strip().split(":", 1)[0] in USER_KINDS


def parse_user_spec(spec: str) -> tuple[str, UserDataOptions]:
    """The kind (``folder`` or ``npz``) and options of a user dataset spec; reads no file.

    Raises:
        UserDataError: for a malformed spec, an unknown option or a value out of range.
    """
    kind, _, rest = spec.strip().partition(":")
    raw: dict[str, str] = {}
    for item in re.split(r":(?=\w+=)", rest) if rest else []:
        key, sep, value = item.partition("=")  # a path may hold ':' (only ':key=' splits)
        if not sep or not key.strip():
            raise user_error(spec, f"expected key=value, got {item!r}")
        raw[key.strip()] = value.strip()
    unknown = sorted(set(raw) - set(_OPTIONS[kind]))
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS[kind]))
        raise user_error(
            spec, f"unknown option(s) {', '.join(unknown)}; expected some of {allowed}"
        )
    try:
        return kind, coerce_params(UserDataOptions, raw)
    except ValueError as exc:
        raise user_error(spec, str(exc)) from None


def user_stats(spec: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The declared per-channel mean and std of a user dataset (None for a bad spec); an npz
    file's channels come from its header (one value when it cannot be read)."""
    try:
        kind, opts = parse_user_spec(spec)
        if kind == "csv":
            return None  # a table's features: no image statistics
        channels, table = opts.channels, False
        if kind == "npz":
            channels = 1
            with zipfile.ZipFile(Path(opts.path).expanduser()) as archive:
                layout = _layout(spec, "x", _headers(archive)["x"][0])
                channels, table = layout[1], layout[0] == "ND"
    except UserDataError:
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        pass  # an unreadable npz: one value for every channel
    mean, std = opts.normalisation(table)
    return (mean,) * channels, (std,) * channels


def load_user_dataset(spec: str, need_test: bool = True) -> Dataset:
    """Load a ``folder:``, ``npz:`` or ``csv:`` dataset, normalised as declared; its name is
    ``spec`` (``need_test=False``: an empty test split is fine, as for a node's own data, used
    whole).

    Raises:
        UserDataNotFoundError: when the path does not exist.
        UserDataError: for a bad spec, or files that are not what they must be.
    """
    kind, opts = parse_user_spec(spec)
    path = Path(opts.path).expanduser()
    what = {"folder": "a directory", "npz": "an .npz file", "csv": "a .csv file"}[kind]
    if not path.exists():
        raise UserDataNotFoundError(f"dataset {spec!r}: expected {what} at {path}, got nothing")
    if path.is_dir() != (kind == "folder"):
        got = "a directory" if path.is_dir() else "a file"
        raise user_error(spec, f"expected {what} at {path}, got {got}")
    read = {"folder": _read_folder, "npz": _read_npz, "csv": read_csv}[kind]
    x, y, x_test, y_test, names = read(spec, path, opts)
    if need_test and not len(y_test):
        raise user_error(
            spec,
            "expected at least one test image, got none (a carved split keeps "
            "a class's only image for training)",
        )
    table = kind == "csv" or (kind == "npz" and _npz_layout(spec, path)[0] == "ND")
    stats = feature_stats(x) if table and standardised(opts) else None
    train = _labelled(x, y, opts, table, stats)
    test = _labelled(x_test, y_test, opts, table, stats)
    return Dataset(spec, train, test, len(names), names)


def input_statistics(spec: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """The ``(mean, std)`` per channel that loading ``spec`` normalises with — a table's per
    feature when it is standardised (re-read from the file's training split), else the
    declared values — and whether it is a table (whose values are not pixels).

    Raises:
        UserDataNotFoundError, UserDataError: as :func:`load_user_dataset`.
    """
    _, opts = parse_user_spec(spec)
    path = Path(opts.path).expanduser()
    if not path.exists():
        raise UserDataNotFoundError(f"dataset {spec!r}: expected a file at {path}, got nothing")
    stat = path.stat()  # the file as it is now: a changed file is read again
    mean, std, table = _input_statistics(spec, str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    return mean.copy(), std.copy(), table


@functools.lru_cache(maxsize=8)
def _input_statistics(
    spec: str, where: str, mtime_ns: int, size: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """:func:`input_statistics` for one state of one file (its resolved path ``where``,
    ``mtime_ns`` and ``size``: the cache key), so that predicting batch by batch reads a
    standardised table once."""
    kind, opts = parse_user_spec(spec)
    path = Path(where)
    table = kind == "csv" or (kind == "npz" and _npz_layout(spec, path)[0] == "ND")
    if kind == "csv" or (table and standardised(opts)):
        x = (read_csv if kind == "csv" else _read_npz)(spec, path, opts)[0]
        if standardised(opts):
            mean, std = feature_stats(x)
            return mean, std, True
        channels = x.shape[1]
    else:
        channels = _npz_layout(spec, path)[1] if kind == "npz" else opts.channels
    mean_value, std_value = opts.normalisation(table)
    return (
        np.full(channels, mean_value, np.float32),
        np.full(channels, std_value, np.float32),
        table,
    )


def standardised(opts: UserDataOptions) -> bool:
    """Whether a table of these options is standardised per feature (see the module docs)."""
    return opts.standardise and opts.mean is None and opts.std is None


def feature_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and standard deviation of a table ``[N, D, 1, 1]`` (float64, as
    float32 arrays ``[D]``); a feature with no spread gets std 1."""
    flat = x.reshape(len(x), -1).astype(np.float64)
    mean = flat.mean(axis=0) if len(flat) else np.zeros(flat.shape[1])
    std = flat.std(axis=0) if len(flat) else np.ones(flat.shape[1])
    std[~(std > 1e-12)] = 1.0
    return mean.astype(np.float32), std.astype(np.float32)


def _labelled(
    x: np.ndarray,
    y: np.ndarray,
    opts: UserDataOptions,
    table: bool = False,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> LabelledData:
    images = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if x.dtype == np.uint8 and not table:  # pixels to [0, 1]; a table's values as given
        images.div_(255.0)
    if stats is not None:  # a table, per feature (the training split's statistics)
        images.sub_(torch.from_numpy(stats[0]).view(1, -1, 1, 1))
        images.div_(torch.from_numpy(stats[1]).view(1, -1, 1, 1))
    else:
        mean, std = opts.normalisation(table)
        images.sub_(mean).div_(std)
    return LabelledData(images, torch.from_numpy(y.astype(np.int64)))


# --------------------------------------------------------------------------- folders


def _read_folder(spec: str, root: Path, opts: UserDataOptions) -> Splits:
    train_dir, test_dir = root / "train", root / "test"
    if train_dir.is_dir() and test_dir.is_dir():
        classes, test_classes = _class_dirs(spec, train_dir), _class_dirs(spec, test_dir)
        if set(classes) != set(test_classes):
            only_train = sorted(set(classes) - set(test_classes))
            only_test = sorted(set(test_classes) - set(classes))
            raise user_error(
                spec,
                f"expected the same class folders in {train_dir} and {test_dir}, got "
                f"{only_train} only in train and {only_test} only in test",
            )
        files, y = _files(spec, list(classes.values()))
        test_files, y_test = _files(spec, list(test_classes.values()))
    else:
        classes = _class_dirs(spec, root)
        every, labels = _files(spec, list(classes.values()))
        test = carve_test(labels, opts.test_fraction)
        files = [f for f, t in zip(every, test, strict=True) if not t]
        test_files = [f for f, t in zip(every, test, strict=True) if t]
        y, y_test = labels[~test], labels[test]
    check_image_count(spec, len(files) + len(test_files), opts)
    x, x_test = _decode_all(spec, files, opts), _decode_all(spec, test_files, opts)
    return x, y, x_test, y_test, tuple(classes)


def _class_dirs(spec: str, folder: Path) -> dict[str, Path]:
    """Class name → folder, sorted by name (hidden folders skipped)."""
    dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not dirs:
        raise user_error(spec, f"expected one subfolder per class in {folder}, got none")
    return {p.name: p for p in dirs}


def _files(spec: str, dirs: list[Path]) -> tuple[list[Path], np.ndarray]:
    """Each class folder's image files (sorted; hidden ones skipped) and their labels."""
    files: list[Path] = []
    labels: list[int] = []
    for label, folder in enumerate(dirs):
        found = sorted(
            p
            for p in folder.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)
            and p.is_file()
        )
        if not found:
            endings = " ".join(sorted(IMAGE_SUFFIXES))
            raise user_error(
                spec, f"expected images ({endings}) in class folder {folder}, got none"
            )
        files += found
        labels += [label] * len(found)
    return files, np.asarray(labels, dtype=np.int64)


def _decode_all(spec: str, files: list[Path], opts: UserDataOptions) -> np.ndarray:
    """The images as ``uint8`` ``[N, C, size, size]``."""
    from PIL import Image

    out = np.empty((len(files), opts.channels, opts.size, opts.size), dtype=np.uint8)
    for i, file in enumerate(files):
        try:
            with Image.open(file) as opened:
                image: Image.Image = opened
                if image.mode.startswith("I;16"):  # 16-bit grey: its high byte, not a clip
                    image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8), "L")
                image = image.convert("L" if opts.channels == 1 else "RGB")
                image = image.resize((opts.size, opts.size), Image.Resampling.BILINEAR)
                pixels = np.asarray(image, dtype=np.uint8)
        except Exception as exc:  # Pillow raises assorted types for a damaged file
            raise user_error(
                spec, f"expected a readable image in {file}, got an unreadable one ({exc})"
            ) from None
        out[i] = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    return out


__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_CLASSES",
    "MAX_FEATURES",
    "MAX_SIDE",
    "USER_KINDS",
    "USER_SPLIT_SEED",
    "UserDataError",
    "UserDataNotFoundError",
    "UserDataOptions",
    "carve_test",
    "input_statistics",
    "is_user_spec",
    "load_user_dataset",
    "parse_user_spec",
    "user_stats",
]
