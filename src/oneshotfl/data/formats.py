"""Readers for the on-disk formats of the registered datasets (no torchvision needed).

* IDX (MNIST, Fashion-MNIST): LeCun's format, gzip-compressed or raw (told apart by the gzip
  magic bytes, not the file name);
* CIFAR-10/100 "python version": pickled batch dicts, read with a restricted unpickler that
  only rebuilds NumPy arrays and builtin containers. These are user-supplied dataset files;
  payloads received from clients never go near pickle;
* SVHN cropped digits: MATLAB v5 ``.mat`` files via SciPy;
* STL-10 binary: raw ``uint8`` images stored column-major, labels 1..10.

Every reader returns images as ``uint8`` arrays ``[N, C, H, W]`` (or ``[N, H, W]`` for IDX) and
labels as ``int64`` ``[N]``; a file that is not what it should be raises :class:`ValueError`
naming the file, what was expected and what was found.
"""

from __future__ import annotations

import codecs
import gzip
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np

_GZIP_MAGIC = b"\x1f\x8b"

#: IDX type byte → NumPy dtype (big-endian on disk).
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def _file_bytes(path: Path) -> bytes:
    """The bytes of ``path``, gunzipped when they start with the gzip magic."""
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(
            f"{path}: expected a valid gzip stream, got a corrupt one ({exc})"
        ) from None


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw).

    The header is two zero bytes, a type byte, the number of dimensions, then one big-endian
    ``uint32`` per dimension; the data follow in C order.

    Args:
        path: the file.

    Returns:
        The array, in native byte order, with the shape the header gives.

    Raises:
        ValueError: on a bad magic number or a data size that does not match the header.
    """
    raw = _file_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise ValueError(
            f"{path}: expected an IDX file (magic 0x0000TTDD with TT in "
            f"{{{', '.join(f'{t:02x}' for t in _IDX_DTYPES)}}} and DD >= 1), "
            f"got magic {raw[:4].hex() or '(empty file)'}"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(
            f"{path}: expected a {header}-byte header for {ndim} dimensions, got {len(raw)} bytes"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: expected {expected} data bytes for header shape {shape}, "
            f"got {len(raw) - header}"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def read_idx_split(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """One split of an MNIST-style dataset: ``uint8`` images ``[N, H, W]`` and labels ``[N]``.

    Raises:
        ValueError: when either file is not an IDX file of the expected rank and type, or the
            two disagree in length.
    """
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or x.dtype != np.uint8:
        raise ValueError(
            f"{images}: expected uint8 images [N, H, W], got {x.dtype} of shape {x.shape}"
        )
    if y.ndim != 1 or y.dtype != np.uint8:
        raise ValueError(f"{labels}: expected uint8 labels [N], got {y.dtype} of shape {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"{labels}: expected {len(x)} labels (one per image), got {len(y)}")
    return x, y.astype(np.int64)


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for a global that :class:`RestrictedUnpickler` does not allow."""


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for ``bytes``, Latin-1 only."""
    try:
        latin1 = codecs.lookup(encoding).name == "iso8859-1"
    except LookupError:
        latin1 = False
    if not latin1:
        raise UnsafePickleError(
            f"refusing _codecs.encode with encoding {encoding!r}: expected latin1"
        )
    return text.encode("latin1")


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that rebuilds only NumPy arrays and builtin containers.

    CIFAR batches are dicts of lists, strings and ``uint8`` arrays. Containers and strings
    need no global lookup at all; arrays need NumPy's reconstruction helpers (``_reconstruct``
    for protocols ≤ 4, ``_frombuffer`` for protocol 5, under both the NumPy 1 ``numpy.core``
    and NumPy 2 ``numpy._core`` module names) and ``bytes`` made by ``_codecs.encode`` in
    pickles written by Python 3 at protocol 2 (allowed for Latin-1 only). Every other global
    (``os.system``, ``builtins.eval``, any class) is refused with :class:`UnsafePickleError`
    before anything is called.
    """

    ALLOWED: frozenset[tuple[str, str]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("builtins", "bytes"),
            ("builtins", "bytearray"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1_encode
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"refusing to load {module}.{name}: expected only NumPy arrays and builtin "
            "containers (a CIFAR batch holds nothing else), so this file is not a CIFAR batch"
        )


def read_cifar_batch(path: Path) -> dict[str, Any]:
    """One CIFAR "python version" batch as a dict with ``str`` keys.

    Raises:
        ValueError: when the file is not a pickled dict (or is truncated or damaged).
        UnsafePickleError: when it asks for anything but arrays and containers.
    """
    with path.open("rb") as fh:
        try:
            data = RestrictedUnpickler(fh, encoding="latin1").load()
        except UnsafePickleError:
            raise
        except Exception as exc:  # a damaged pickle fails in many ways
            raise ValueError(
                f"{path}: expected a pickled CIFAR batch, got an unreadable file ({exc!r})"
            ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(data).__name__}")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in data.items()}


def cifar_arrays(
    batch: dict[str, Any], path: Path, label_key: str
) -> tuple[np.ndarray, np.ndarray]:
    """``[N, 3, 32, 32]`` uint8 images and ``int64`` labels from a CIFAR batch.

    The ``data`` rows hold the red, green and blue 32×32 planes one after another, each in
    row-major order.

    Raises:
        ValueError: when ``data`` or ``label_key`` is missing or has the wrong shape or type.
    """
    if "data" not in batch or label_key not in batch:
        raise ValueError(
            f"{path}: expected keys 'data' and {label_key!r}, got {sorted(map(str, batch))}"
        )
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        got = f"shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{path}: expected 'data' as an array [N, 3072], got {got}")
    if data.dtype != np.uint8:
        raise ValueError(f"{path}: expected 'data' of dtype uint8, got {data.dtype}")
    try:
        labels = np.asarray(batch[label_key], dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: expected {label_key!r} as a list of integers") from None
    if len(labels) != len(data):
        raise ValueError(
            f"{path}: expected {len(data)} entries in {label_key!r} (one per image), "
            f"got {len(labels)}"
        )
    return data.reshape(-1, 3, 32, 32), labels


def read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN cropped digits: ``X`` (H×W×C×N) → ``[N, 3, 32, 32]`` uint8, ``y`` with 10 → 0.

    SVHN labels the digit 0 as 10; like torchvision, it becomes 0.

    Raises:
        ValueError: when the file is not a readable ``.mat`` with ``X`` and ``y`` of matching
            shapes and labels in 1..10 (or 0..9).
    """
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
    except Exception as exc:  # SciPy raises assorted types for a corrupt file
        raise ValueError(
            f"{path}: expected a MATLAB v5 .mat file, got an unreadable one ({exc})"
        ) from None
    if "X" not in mat or "y" not in mat:
        keys = sorted(k for k in mat if not k.startswith("__"))
        raise ValueError(f"{path}: expected variables 'X' and 'y', got {keys}")
    x = np.asarray(mat["X"])
    y = np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise ValueError(f"{path}: expected X of shape (32, 32, 3, {len(y)}), got {x.shape}")
    if len(y) and (y.min() < 0 or y.max() > 10):
        raise ValueError(f"{path}: expected labels in 1..10, got {y.min()}..{y.max()}")
    y[y == 10] = 0
    return np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1)), dtype=np.uint8), y


_STL_IMAGE = 3 * 96 * 96


def read_stl10(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """One STL-10 split: ``[N, 3, 96, 96]`` uint8 images and labels 1..10 → 0..9.

    Each image is stored as three 96×96 planes in column-major order, so the raw
    ``[N, 3, 96, 96]`` view is ``[N, C, W, H]`` and is transposed (as torchvision does).

    Raises:
        ValueError: on a size that is not whole images, a label count that differs from the
            image count, or a label outside 1..10.
    """
    raw = np.fromfile(images, dtype=np.uint8)
    if raw.size % _STL_IMAGE:
        raise ValueError(
            f"{images}: expected a multiple of {_STL_IMAGE} bytes (3×96×96 images), got {raw.size}"
        )
    x = raw.reshape(-1, 3, 96, 96).transpose(0, 1, 3, 2)
    y = np.fromfile(labels, dtype=np.uint8).astype(np.int64)
    if len(y) != len(x):
        raise ValueError(f"{labels}: expected {len(x)} labels (one per image), got {len(y)}")
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise ValueError(f"{labels}: expected labels in 1..10, got {y.min()}..{y.max()}")
    return np.ascontiguousarray(x), y - 1
