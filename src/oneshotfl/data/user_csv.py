"""The ``csv:`` reader of user datasets: a table, one example per row (see
:mod:`oneshotfl.data.user`).

``csv:path=FILE[:label=COLUMN]`` — comma-separated values; the first row is a header when any
of its fields is not a number. The label is the column ``label`` names (a header name, or a
0-based index), by default the last one; labels that are all integers are class ids 0..C−1
(``classes`` as for npz), any others are class names, numbered in sorted order. Every other
column is a feature and must be a finite number. Rows and columns are counted as they are read
and refused beyond ``max_images`` rows or :data:`~oneshotfl.data.user_npz.MAX_FEATURES`
columns, before anything larger is allocated; the test split is carved like an npz file's.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from oneshotfl.data.user_npz import MAX_FEATURES
from oneshotfl.data.user_options import (
    MAX_CLASSES,
    Splits,
    UserDataError,
    UserDataOptions,
    carve_test,
    user_error,
)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _label_column(spec: str, header: list[str] | None, width: int, label: str | None) -> int:
    """The label column's index: ``label`` as a header name or an index, else the last."""
    if label is None:
        return width - 1
    if header is not None and label in header:
        return header.index(label)
    if label.lstrip("-").isdigit() and -width <= int(label) < width:
        return int(label) % width
    names = f"one of {header}" if header is not None else f"an index below {width}"
    raise user_error(spec, f"label: expected {names}, got {label!r}")


def _rows(spec: str, path: Path, opts: UserDataOptions) -> tuple[list[str] | None, list[list[str]]]:
    """The header (if any) and the rows, counted and bounded as they are read."""
    rows: list[list[str]] = []
    header: list[str] | None = None
    width = 0
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            for number, row in enumerate(csv.reader(handle), start=1):
                if not row or all(not field.strip() for field in row):
                    continue  # blank lines
                if not width:
                    width = len(row)
                    if not 2 <= width <= MAX_FEATURES + 1:
                        raise user_error(
                            spec, f"expected 2..{MAX_FEATURES + 1} columns, got {width}"
                        )
                    if any(_number(field) is None for field in row):
                        header = [field.strip() for field in row]
                        continue
                if len(row) != width:
                    raise user_error(
                        spec, f"line {number}: expected {width} fields, got {len(row)}"
                    )
                if len(rows) >= opts.max_images:
                    raise user_error(
                        spec, f"expected at most {opts.max_images} rows (max_images), got more"
                    )
                rows.append(row)
    except UnicodeDecodeError as exc:
        raise user_error(spec, f"expected UTF-8 text in {path}, got {exc.reason}") from None
    except csv.Error as exc:
        raise user_error(spec, f"expected comma-separated values in {path}: {exc}") from None
    if not rows:
        raise user_error(spec, f"expected at least one row of values in {path}, got none")
    return header, rows


def read_csv(spec: str, path: Path, opts: UserDataOptions) -> Splits:
    """``x`` (a table ``[N, D, 1, 1]`` of float32), ``y``, the carved test split and the
    class names of a ``csv:`` dataset.

    Raises:
        UserDataError: for anything that is not such a table (one line naming the spec).
    """
    header, rows = _rows(spec, path, opts)
    width = len(rows[0])
    at = _label_column(spec, header, width, opts.label)
    labels = [row[at].strip() for row in rows]
    features = np.empty((len(rows), width - 1), dtype=np.float32)
    for i, row in enumerate(rows):
        values = [_number(field) for j, field in enumerate(row) if j != at]
        if any(v is None for v in values):
            j, bad = next((j, f) for j, f in enumerate(row) if j != at and _number(f) is None)
            column = f"column {header[j]!r}" if header else f"column {j}"
            what = "an empty cell" if not bad.strip() else repr(bad)
            raise user_error(spec, f"row {i + 1}, {column}: expected a finite number, got {what}")
        features[i] = values
    y, names = _classes(spec, labels, opts)
    test = carve_test(y, opts.test_fraction)
    x = features[:, :, None, None]
    return x[~test], y[~test], x[test], y[test], names


def _classes(
    spec: str, labels: list[str], opts: UserDataOptions
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Integer labels 0..C−1 and the class names."""
    if all(label.lstrip("-").isdigit() for label in labels):
        y = np.array([int(label) for label in labels], dtype=np.int64)
        if y.min() < 0:
            raise user_error(spec, f"expected labels >= 0, got {int(y.min())}")
        classes = opts.classes or int(y.max()) + 1
        if int(y.max()) >= classes or classes > MAX_CLASSES:
            raise user_error(
                spec, f"expected labels below classes={classes} (at most {MAX_CLASSES})"
            )
        return y, tuple(str(c) for c in range(classes))
    names = tuple(sorted(set(labels)))
    if len(names) > MAX_CLASSES:
        raise user_error(spec, f"expected at most {MAX_CLASSES} classes, got {len(names)}")
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[label] for label in labels], dtype=np.int64), names


__all__ = ["UserDataError", "read_csv"]
