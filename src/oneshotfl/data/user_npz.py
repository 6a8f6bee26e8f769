"""The ``npz:`` reader of user datasets: shapes and dtypes checked from the archive's headers
before any array is read, nothing unpickled (see :mod:`oneshotfl.data.user`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from oneshotfl.data.user_options import (
    MAX_CLASSES,
    MAX_SIDE,
    Splits,
    UserDataError,
    UserDataOptions,
    carve_test,
    check_image_count,
    user_error,
)

_NPZ_KEYS = ("x", "y", "x_test", "y_test")
#: An npz image layout (its letters are its axes) with the axes of C (None: grey), H and W.
_LAYOUTS: tuple[tuple[str, int | None, int, int], ...] = (
    ("NHW", None, 1, 2),
    ("NCHW", 1, 2, 3),
    ("NHWC", 3, 1, 2),
)
#: The most features of a table ``[N, D]``.
MAX_FEATURES = 100_000

#: An npz member's shape and dtype.
Header = tuple[tuple[int, ...], np.dtype]
#: An array's layout (``ND`` for a table), channels (a table's features) and image height, width.
Layout = tuple[str, int, int, int]


def _npz_layout(spec: str, path: Path) -> Layout:
    """The layout of an npz file's ``x``, from its header."""
    with zipfile.ZipFile(path) as archive:
        return _layout(spec, "x", _headers(archive)["x"][0])


def _read_npz(spec: str, path: Path, opts: UserDataOptions) -> Splits:
    try:
        with zipfile.ZipFile(path) as archive:
            headers = _headers(archive)
            layouts = _check_headers(spec, path, headers, opts)
            arrays = {k: _array(archive, k) for k in _NPZ_KEYS if k in headers}
    except UserDataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise user_error(
            spec, f"expected an .npz archive at {path}, got an unreadable one ({exc})"
        ) from None
    for key, layout in layouts.items():
        arrays[key] = _images(spec, key, arrays[key], layout)
    for key in (k for k in ("y", "y_test") if k in arrays and len(arrays[k])):
        if arrays[key].min() < 0:
            raise user_error(spec, f"expected {key} as labels >= 0, got {arrays[key].min()}")
    if "y_test" not in arrays:
        test = carve_test(arrays["y"], opts.test_fraction)
        arrays["x"], arrays["x_test"] = arrays["x"][~test], arrays["x"][test]
        arrays["y"], arrays["y_test"] = arrays["y"][~test], arrays["y"][test]
    top = int(np.concatenate([arrays["y"], arrays["y_test"]]).max())
    limit = opts.classes or MAX_CLASSES
    if top >= limit:
        why = f"classes={limit}" if opts.classes else f"at most {MAX_CLASSES} classes"
        raise user_error(spec, f"expected labels in 0..{limit - 1} ({why}), got {top}")
    absent = sorted(set(range(top + 1)) - set(np.unique(arrays["y"]).tolist()))
    if absent and not opts.classes:  # a gap would add classes no example has
        raise user_error(
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
        raise user_error(spec, f"expected arrays 'x' and 'y' in {path}, got {sorted(headers)}")
    if ("x_test" in headers) != ("y_test" in headers):
        only = "x_test" if "x_test" in headers else "y_test"
        raise user_error(spec, f"expected both x_test and y_test in {path} or neither, got {only}")
    for key in (k for k in _NPZ_KEYS if k in headers and headers[k][1].hasobject):
        raise user_error(
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
            raise user_error(spec, f"expected {xk} of dtype uint8 or float, got {x_dtype}")
        layouts[xk] = _layout(spec, xk, x_shape)
        if layouts[xk][1:] != layouts["x"][1:]:
            want, got = layouts["x"][1:], layouts[xk][1:]
            raise user_error(
                spec, f"expected {xk} like x: (channels, height, width) {want}, got {got}"
            )
        if len(y_shape) != 1 or y_dtype.kind not in "iu":
            raise user_error(spec, f"expected {yk} as integer labels [N], got {y_dtype} {y_shape}")
        if y_shape[0] != x_shape[0]:
            raise user_error(
                spec, f"expected {y_shape[0]} images in {xk} (one per label), got {x_shape[0]}"
            )
    if not headers["x"][0][0]:
        raise user_error(spec, f"expected images in x, got shape {headers['x'][0]}")
    check_image_count(spec, sum(headers[k][0][0] for k in layouts), opts)
    return layouts


def _layout(spec: str, key: str, shape: tuple[int, ...]) -> Layout:
    """The layout, channels and height, width of an image array (or a table) of ``shape``."""
    if len(shape) == 2:
        if not 1 <= shape[1] <= MAX_FEATURES:
            raise user_error(
                spec, f"expected {key} with 1..{MAX_FEATURES} features, got {shape[1]}"
            )
        return "ND", shape[1], 1, 1
    for name, c, h, w in _LAYOUTS:
        if len(shape) == len(name) and (c is None or shape[c] in (1, 3)):
            if not (1 <= shape[h] <= MAX_SIDE and 1 <= shape[w] <= MAX_SIDE):
                sides = f"{shape[h]}x{shape[w]}"
                raise user_error(spec, f"expected {key} with sides in 1..{MAX_SIDE}, got {sides}")
            return name, 1 if c is None else shape[c], shape[h], shape[w]
    raise user_error(
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
            raise user_error(spec, f"expected {key} as finite numbers, got non-finite values")
        if layout[0] != "ND" and (x.min() < 0 or x.max() > 1):
            raise user_error(spec, f"expected {key} as floats in [0, 1], got {x.min()}..{x.max()}")
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
