"""Files written whole or not at all (:mod:`oneshotfl.atomic`): text, JSON documents and CSV
tables (``result.json``, its CSV views, reports)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oneshotfl.atomic import atomic_write_text

__all__ = ["atomic_write_text", "json_document", "write_csv", "write_json"]


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


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """``doc`` as indented JSON (arrays and tuples as lists), written whole."""
    atomic_write_text(path, json.dumps(doc, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def json_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` as ``result.json`` holds it (arrays and tuples as lists)."""
    plain: dict[str, Any] = json.loads(json.dumps(doc, default=_json_default))
    return plain
