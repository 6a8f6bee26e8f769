"""Files written whole or not at all (:mod:`oneshotfl.atomic`): text, and CSV tables
(``result.json``, its CSV views, reports)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oneshotfl.atomic import atomic_write_text

__all__ = ["atomic_write_text", "write_csv"]


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Rows as CSV with the given columns (missing values left empty), written whole."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in columns})
    atomic_write_text(path, buffer.getvalue())


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value
