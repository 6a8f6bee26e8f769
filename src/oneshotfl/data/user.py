"""User-supplied datasets, named wherever a dataset name is by a spec: an image folder,
``folder:path=DIR``, or NumPy arrays, ``npz:path=FILE``, each with ``:key=value`` options.

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
are sides above :data:`MAX_SIDE`). A relative path is
relative to the working directory; ``data_root`` and ``download`` do not apply. Problems
raise :class:`UserDataNotFoundError` (no such path) or :class:`UserDataError`, one sentence
naming the spec and the file.
"""

from __future__ import annotations

import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.lib import format as npy

from oneshotfl.data.datasets import DatasetFormatError, DatasetNotFoundError
from oneshotfl.data.types import Dataset, LabelledData
from oneshotfl.params import Params, coerce_params, is_int, require

#: The spec names of user datasets.
USER_KINDS = ("folder", "npz")
#: The fixed seed of carved test splits; never tied to experiment seeds.
USER_SPLIT_SEED = 20_250_301
#: The largest image side accepted (``size``, or an npz image's side).
MAX_SIDE = 1024
#: The most classes an npz file may have (``classes``, or its largest label + 1).
MAX_CLASSES = 100_000
#: The file endings read as images in a folder (compared lower-cased).
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})

_COMMON = ("path", "test_fraction", "mean", "std", "max_images")
_OPTIONS = {"folder": (*_COMMON, "size", "channels"), "npz": (*_COMMON, "classes")}
_NPZ_KEYS = ("x", "y", "x_test", "y_test")
#: An npz image layout (its letters are its axes) with the axes of C (None: grey), H and W.
_LAYOUTS: tuple[tuple[str, int | None, int, int], ...] = (
    ("NHW", None, 1, 2),
    ("NCHW", 1, 2, 3),
    ("NHWC", 3, 1, 2),
)
#: The most features of a table ``[N, D]``.
MAX_FEATURES = 100_000

#: ``x, y, x_test, y_test, class_names``: ``[N, C, S, S]`` images (uint8 or floats in [0, 1]).
Splits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]
#: An npz member's shape and dtype.
Header = tuple[tuple[int, ...], np.dtype]
#: An array's layout (``ND`` for a table), channels (a table's features) and image height, width.
Layout = tuple[str, int, int, int]


class UserDataError(DatasetFormatError):
    """A ``folder:`` or ``npz:`` dataset whose spec or files are not what they must be."""


class UserDataNotFoundError(DatasetNotFoundError):
    """A ``folder:`` or ``npz:`` dataset whose path does not exist."""


@dataclass(frozen=True)
class UserDataOptions(Params):
    """A user dataset spec's options (see the module docs); ``size`` and ``channels`` are a
    folder's, ``classes`` an npz file's."""

    path: str = ""
    size: int = 32
    channels: int = 3
    classes: int | None = None
    test_fraction: float = 0.2
    mean: float | None = None
    std: float | None = None
    max_images: int = 2_000_000

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

    def normalisation(self, table: bool) -> tuple[float, float]:
        """``(mean, std)``: as declared, else 0.5, 0.5 for pixels and 0, 1 for a table."""
        mean = self.mean if self.mean is not None else (0.0 if table else 0.5)
        std = self.std if self.std is not None else (1.0 if table else 0.5)
        return mean, std
        require(is_int(self.max_images, 1), "max_images", "an integer >= 1", self.max_images)


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
            raise _error(spec, f"expected key=value, got {item!r}")
        raw[key.strip()] = value.strip()
    unknown = sorted(set(raw) - set(_OPTIONS[kind]))
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS[kind]))
        raise _error(spec, f"unknown option(s) {', '.join(unknown)}; expected some of {allowed}")
    try:
        return kind, coerce_params(UserDataOptions, raw)
    except ValueError as exc:
        raise _error(spec, str(exc)) from None


def user_stats(spec: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The declared per-channel mean and std of a user dataset (None for a bad spec); an npz
    file's channels come from its header (one value when it cannot be read)."""
    try:
        kind, opts = parse_user_spec(spec)
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
    """Load a ``folder:`` or ``npz:`` dataset, normalised as declared; its name is ``spec``
    (``need_test=False``: an empty test split is fine, as for a node's own data, used whole).

    Raises:
        UserDataNotFoundError: when the path does not exist.
        UserDataError: for a bad spec, or files that are not what they must be.
    """
    kind, opts = parse_user_spec(spec)
    path = Path(opts.path).expanduser()
    what = "a directory" if kind == "folder" else "an .npz file"
    if not path.exists():
        raise UserDataNotFoundError(f"dataset {spec!r}: expected {what} at {path}, got nothing")
    if path.is_dir() != (kind == "folder"):
        got = "a directory" if path.is_dir() else "a file"
        raise _error(spec, f"expected {what} at {path}, got {got}")
    read = _read_folder if kind == "folder" else _read_npz
    x, y, x_test, y_test, names = read(spec, path, opts)
    if need_test and not len(y_test):
        raise _error(
            spec,
            "expected at least one test image, got none (a carved split keeps "
            "a class's only image for training)",
        )
    table = kind == "npz" and _npz_layout(spec, path)[0] == "ND"
    train, test = _labelled(x, y, opts, table), _labelled(x_test, y_test, opts, table)
    return Dataset(spec, train, test, len(names), names)


def _npz_layout(spec: str, path: Path) -> Layout:
    """The layout of an npz file's ``x``, from its header."""
    with zipfile.ZipFile(path) as archive:
        return _layout(spec, "x", _headers(archive)["x"][0])


def carve_test(y: np.ndarray, fraction: float) -> np.ndarray:
    """The test mask of a carved split: per class in label order, the first
    ``min(round(fraction·n), n − 1)`` of a permutation drawn from :data:`USER_SPLIT_SEED`."""
    rng = np.random.default_rng(USER_SPLIT_SEED)
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test[idx[: min(round(fraction * len(idx)), len(idx) - 1)]] = True
    return test


def _error(spec: str, text: str) -> UserDataError:
    return UserDataError(f"dataset {spec!r}: {text}")


def _check_count(spec: str, total: int, opts: UserDataOptions) -> None:
    if not 1 <= total <= opts.max_images:
        raise _error(spec, f"expected 1..{opts.max_images} images in all (max_images), got {total}")


def _labelled(
    x: np.ndarray, y: np.ndarray, opts: UserDataOptions, table: bool = False
) -> LabelledData:
    images = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if x.dtype == np.uint8:
        images.div_(255.0)
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
            raise _error(
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
    _check_count(spec, len(files) + len(test_files), opts)
    x, x_test = _decode_all(spec, files, opts), _decode_all(spec, test_files, opts)
    return x, y, x_test, y_test, tuple(classes)


def _class_dirs(spec: str, folder: Path) -> dict[str, Path]:
    """Class name → folder, sorted by name (hidden folders skipped)."""
    dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not dirs:
        raise _error(spec, f"expected one subfolder per class in {folder}, got none")
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
            raise _error(spec, f"expected images ({endings}) in class folder {folder}, got none")
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
            raise _error(
                spec, f"expected a readable image in {file}, got an unreadable one ({exc})"
            ) from None
        out[i] = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
    return out


# --------------------------------------------------------------------------- npz files


def _read_npz(spec: str, path: Path, opts: UserDataOptions) -> Splits:
    try:
        with zipfile.ZipFile(path) as archive:
            headers = _headers(archive)
            layouts = _check_headers(spec, path, headers, opts)
            arrays = {k: _array(archive, k) for k in _NPZ_KEYS if k in headers}
    except UserDataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise _error(
            spec, f"expected an .npz archive at {path}, got an unreadable one ({exc})"
        ) from None
    for key, layout in layouts.items():
        arrays[key] = _images(spec, key, arrays[key], layout)
    for key in (k for k in ("y", "y_test") if k in arrays and len(arrays[k])):
        if arrays[key].min() < 0:
            raise _error(spec, f"expected {key} as labels >= 0, got {arrays[key].min()}")
    if "y_test" not in arrays:
        test = carve_test(arrays["y"], opts.test_fraction)
        arrays["x"], arrays["x_test"] = arrays["x"][~test], arrays["x"][test]
        arrays["y"], arrays["y_test"] = arrays["y"][~test], arrays["y"][test]
    top = int(np.concatenate([arrays["y"], arrays["y_test"]]).max())
    limit = opts.classes or MAX_CLASSES
    if top >= limit:
        why = f"classes={limit}" if opts.classes else f"at most {MAX_CLASSES} classes"
        raise _error(spec, f"expected labels in 0..{limit - 1} ({why}), got {top}")
    absent = sorted(set(range(top + 1)) - set(np.unique(arrays["y"]).tolist()))
    if absent and not opts.classes:  # a gap would add classes no example has
        raise _error(
            spec,
            f"expected every label 0..{top} in y (or classes=K to declare empty ones), "
            f"got none of {absent[:10]}{' …' if len(absent) > 10 else ''}",
        )
    names = tuple(str(c) for c in range(opts.classes or top + 1))
    return arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"], names


def _headers(archive: zipfile.ZipFile) -> dict[str, Header]:
    """Shape and dtype of every ``NAME.npy`` member, from its header alone."""
    out = {}
    for info in archive.infolist():
        if info.filename.endswith(".npy"):
            with archive.open(info) as fh:
                one = npy.read_magic(fh) == (1, 0)
                read = npy.read_array_header_1_0 if one else npy.read_array_header_2_0
                shape, _, dtype = read(fh)
            out[info.filename.removesuffix(".npy")] = (tuple(shape), dtype)
    return out


def _check_headers(
    spec: str, path: Path, headers: dict[str, Header], opts: UserDataOptions
) -> dict[str, Layout]:
    """Check keys, dtypes, shapes and counts before any array is read; the image layouts."""
    if "x" not in headers or "y" not in headers:
        raise _error(spec, f"expected arrays 'x' and 'y' in {path}, got {sorted(headers)}")
    if ("x_test" in headers) != ("y_test" in headers):
        only = "x_test" if "x_test" in headers else "y_test"
        raise _error(spec, f"expected both x_test and y_test in {path} or neither, got {only}")
    for key in (k for k in _NPZ_KEYS if k in headers and headers[k][1].hasobject):
        raise _error(
            spec,
            f"array {key!r} in {path} holds Python objects, which need pickle; expected "
            "numeric arrays (npz files are read with allow_pickle=False)",
        )
    layouts: dict[str, Layout] = {}
    for xk, yk in (("x", "y"), ("x_test", "y_test")):
        if xk not in headers:
            continue
        (x_shape, x_dtype), (y_shape, y_dtype) = headers[xk], headers[yk]
        if x_dtype != np.uint8 and x_dtype.kind != "f":
            raise _error(spec, f"expected {xk} of dtype uint8 or float, got {x_dtype}")
        layouts[xk] = _layout(spec, xk, x_shape)
        if layouts[xk][1:] != layouts["x"][1:]:
            want, got = layouts["x"][1:], layouts[xk][1:]
            raise _error(spec, f"expected {xk} like x: (channels, height, width) {want}, got {got}")
        if len(y_shape) != 1 or y_dtype.kind not in "iu":
            raise _error(spec, f"expected {yk} as integer labels [N], got {y_dtype} {y_shape}")
        if y_shape[0] != x_shape[0]:
            raise _error(
                spec, f"expected {y_shape[0]} images in {xk} (one per label), got {x_shape[0]}"
            )
    if not headers["x"][0][0]:
        raise _error(spec, f"expected images in x, got shape {headers['x'][0]}")
    _check_count(spec, sum(headers[k][0][0] for k in layouts), opts)
    return layouts


def _layout(spec: str, key: str, shape: tuple[int, ...]) -> Layout:
    """The layout, channels and height, width of an image array (or a table) of ``shape``."""
    if len(shape) == 2:
        if not 1 <= shape[1] <= MAX_FEATURES:
            raise _error(spec, f"expected {key} with 1..{MAX_FEATURES} features, got {shape[1]}")
        return "ND", shape[1], 1, 1
    for name, c, h, w in _LAYOUTS:
        if len(shape) == len(name) and (c is None or shape[c] in (1, 3)):
            if not (1 <= shape[h] <= MAX_SIDE and 1 <= shape[w] <= MAX_SIDE):
                sides = f"{shape[h]}x{shape[w]}"
                raise _error(spec, f"expected {key} with sides in 1..{MAX_SIDE}, got {sides}")
            return name, 1 if c is None else shape[c], shape[h], shape[w]
    raise _error(
        spec,
        f"expected {key} as images [N, H, W], [N, C, H, W] or [N, H, W, C] with C in {{1, 3}}, "
        f"or a table [N, D], got shape {shape}",
    )


def _array(archive: zipfile.ZipFile, key: str) -> np.ndarray:
    with archive.open(f"{key}.npy") as fh:
        return np.asarray(npy.read_array(fh, allow_pickle=False))


def _images(spec: str, key: str, x: np.ndarray, layout: Layout) -> np.ndarray:
    """``x`` as square ``[N, C, S, S]``: uint8, or floats checked to lie in [0, 1] (a table's
    finite); a non-square image zero-padded, centred, to its longer side."""
    if x.dtype.kind == "f" and x.size:
        if not np.isfinite(x).all():
            raise _error(spec, f"expected {key} as finite numbers, got non-finite values")
        if layout[0] != "ND" and (x.min() < 0 or x.max() > 1):
            raise _error(spec, f"expected {key} as floats in [0, 1], got {x.min()}..{x.max()}")
    if layout[0] == "ND":
        return x[:, :, None, None]
    if layout[0] == "NHW":
        x = x[:, None]
    elif layout[0] == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    h, w = x.shape[2:]
    if h == w:
        return x
    side = max(h, w)
    top, left = (side - h) // 2, (side - w) // 2
    pad = ((0, 0), (0, 0), (top, side - h - top), (left, side - w - left))
    return np.pad(x, pad)
