"""Writing and reading run results: ``result.json``, ``methods.csv``, ``clients.csv``."""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
METHOD_COLUMNS = (
    "key",
    "method",
    "outcome",
    "accuracy",
    "personal_accuracy",
    "accuracy_best",
    "accuracy_worst",
    "rounds",
    "upload_bytes_mean",
    "download_bytes_per_client",
    "client_wall_s_mean",
    "client_train_s_mean",
    "server_wall_s",
)
CLIENT_COLUMNS = (
    "client",
    "arch",
    "train_size",
    "val_size",
    "local_test_accuracy",
    "local_val_accuracy",
    "label_histogram",
)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Rows as CSV with the given columns (missing values left empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _cell(row.get(c)) for c in columns})
    os.replace(tmp, path)


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else value


def write_result(out_dir: Path, doc: dict[str, Any]) -> Path:
    """Write the result document and its CSV views into ``out_dir``; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT_FILE
    atomic_write_text(path, json.dumps(doc, indent=2, default=_json_default) + "\n")
    write_csv(out_dir / "methods.csv", doc["methods"], METHOD_COLUMNS)
    write_csv(out_dir / "clients.csv", doc["clients"], CLIENT_COLUMNS)
    privacy = {
        m["key"]: m["diagnostics"]["privacy"]
        for m in doc["methods"]
        if isinstance(m.get("diagnostics"), dict) and "privacy" in m["diagnostics"]
    }
    if privacy:  # per method: every uploaded field, covered by a DP guarantee or not
        atomic_write_text(out_dir / "privacy.json", json.dumps(privacy, indent=2) + "\n")
    return path


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def iter_results(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every ``result.json`` under ``root`` (sorted by path) with its parsed content."""
    for path in sorted(root.rglob(RESULT_FILE)):
        try:
            yield path, json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: expected a JSON result document, got invalid JSON ({exc})"
            ) from None
