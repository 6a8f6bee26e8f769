"""Readers for the on-disk formats of the registered datasets (no torchvision needed).

* IDX (MNIST, Fashion-MNIST): LeCun's format, gzip-compressed or raw;
* CIFAR-10/100 "python version": pickled batch dicts, read with a restricted unpickler that
  only rebuilds NumPy arrays and builtin containers (these are user-supplied dataset files —
  payloads received from clients never go near pickle);
* SVHN cropped digits: MATLAB ``.mat`` files via SciPy;
* STL-10 binary: raw ``uint8`` images stored column-major.
"""

from __future__ import annotations

import gzip
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw).

    Raises:
        ValueError: on a bad magic number or a size that does not match the header.
    """
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(
            f"{path}: expected an IDX file (magic 0x0000TTDD), got bytes {raw[:4].hex()}"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: header shape {shape} needs {expected} data bytes, got {len(raw) - header}"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


class _ArrayUnpickler(pickle.Unpickler):
    """Allows only what CIFAR's pickles contain: NumPy array reconstruction and builtins."""

    ALLOWED: frozenset[tuple[str, str]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("builtins", "bytes"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a CIFAR batch holds only arrays, lists and "
            "bytes; this file is not a CIFAR batch"
        )


def read_cifar_batch(path: Path) -> dict[str, Any]:
    """One CIFAR "python version" batch as a dict with ``str`` keys."""
    with path.open("rb") as fh:
        data = _ArrayUnpickler(io.BufferedReader(fh), encoding="latin1").load()
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a dict batch, got {type(data).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in data.items()}


def cifar_images(batch: dict[str, Any], path: Path) -> np.ndarray:
    """``[N, 3, 32, 32]`` uint8 images from a batch's flat ``data`` rows."""
    data = np.asarray(batch.get("data"))
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: expected data of shape [N, 3072], got {data.shape}")
    return data.reshape(-1, 3, 32, 32).astype(np.uint8)


def read_svhn_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN ``X`` (H×W×C×N) and ``y`` as ``[N, 3, 32, 32]`` uint8 and labels 0..9 (10 → 0)."""
    from scipy.io import loadmat

    mat = loadmat(str(path))
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise ValueError(f"{path}: expected X of shape [32, 32, 3, N={len(y)}], got {x.shape}")
    y[y == 10] = 0
    return np.transpose(x, (3, 2, 0, 1)).astype(np.uint8), y


def read_stl10(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """STL-10 binary images (column-major 3×96×96) and labels 1..10 → ``[N,3,96,96]``, 0..9."""
    raw = np.fromfile(images, dtype=np.uint8)
    if raw.size % (3 * 96 * 96):
        raise ValueError(f"{images}: expected a multiple of 27648 bytes, got {raw.size}")
    x = raw.reshape(-1, 3, 96, 96).transpose(0, 1, 3, 2)
    y = np.fromfile(labels, dtype=np.uint8).astype(np.int64) - 1
    if len(y) != len(x) or (len(y) and (y.min() < 0 or y.max() > 9)):
        raise ValueError(f"{labels}: expected {len(x)} labels in 1..10, got {len(y)} labels")
    return np.ascontiguousarray(x), y
