"""Render the before/after comparisons of `make check-reproduce` as a markdown table.

Reads every ``*.json`` written by ``oneshotfl compare --out`` in the results directory
(default ``benchmarks/results/reproduce``) and splices one row per comparison into
``docs/benchmarks/reproducibility.md`` between the ``<!-- report:reproduce -->`` markers.

Usage: python scripts/reproduce_report.py [RESULTS_DIR] [MARKDOWN]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from oneshotfl.runner.report import splice_markdown


def table(results: Path, link_from: Path) -> str:
    """One row per comparison file: runs and method rows compared, how many are identical,
    and the methods whose change was intended; each file linked relative to ``link_from``
    (the markdown's folder)."""
    files = sorted(results.glob("*.json"))
    if not files:
        raise SystemExit(f"reproduce_report: expected comparisons in {results}, found none")
    lines = [
        "| comparison | runs identical | method rows identical | changed as intended |",
        "|---|---:|---:|---|",
    ]
    for file in files:
        summary = json.loads(file.read_text())["summary"]
        changed = ", ".join(f"`{m}`" for m in summary["methods_changed_as_intended"]) or "–"
        lines.append(
            f"| [`{file.stem}`]({Path(os.path.relpath(file.resolve(), link_from)).as_posix()}) "
            f"| {summary['runs_identical']} / {summary['runs']} "
            f"| {summary['method_rows_identical']} / {summary['method_rows']} | {changed} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    results = Path(argv[0]) if argv else Path("benchmarks/results/reproduce")
    markdown = Path(argv[1]) if len(argv) > 1 else Path("docs/benchmarks/reproducibility.md")
    splice_markdown(markdown, "reproduce", table(results, markdown.parent.resolve()))


if __name__ == "__main__":
    main(sys.argv[1:])
