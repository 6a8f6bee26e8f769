"""Render the robust-aggregation goal tables (issue 15) from committed sweep results.

Reads ``benchmarks/results/robust-models`` and ``robust-predictions`` (one run per attack and
number of malicious clients m ∈ {0, 1, 2, 3}) and splices, between the markers
``robust-goal-models`` and ``robust-goal-predictions`` of ``docs/benchmarks/security.md``, one table
per sweep: for every method (plain and robust modes) and attack, the test accuracy at
m = 0 / 1 / 2 / 3 and the gap at m = 2 to the same method's clean run (m = 0). The issue's
goal is a gap of at most 3 points for the robust modes; a ✓ marks the cells that meet it.

Usage: ``python scripts/robust_report.py [RESULTS_ROOT] [MARKDOWN]``.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from oneshotfl.runner.report import splice_markdown

GOAL = 3.0
"""Largest drop, in points, from the clean run at 2 of 10 malicious clients."""


def load(root: Path) -> dict[tuple[str, str], dict[int, float]]:
    """``(method key, attack) → {m: accuracy %}`` over every run under ``root``."""
    table: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for file in sorted(root.glob("*/result.json")):
        doc = json.loads(file.read_text())
        config = doc["config"]
        for method in doc["methods"]:
            key = (method["key"], config["attack"])
            table[key][int(config["malicious"])] = 100 * method["accuracy"]
    return table


def render(table: dict[tuple[str, str], dict[int, float]]) -> str:
    """The markdown table: one row per (method, attack)."""
    lines = [
        "| method | attack | m = 0 | m = 1 | m = 2 | m = 3 | m = 2 against m = 0 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    methods = list(dict.fromkeys(method for method, _ in table))
    attacks = sorted({attack for _, attack in table})
    for method in methods:
        for attack in attacks:
            row = table.get((method, attack))
            if row is None:
                continue
            cells = [f"{row[m]:.2f}" if m in row else "–" for m in range(4)]
            gap = "–"
            if 0 in row and 2 in row:
                drop = row[2] - row[0]
                gap = f"{drop:+.2f}" + (" ✓" if drop >= -GOAL else "")
            lines.append(f"| `{method}` | `{attack}` | {' | '.join(cells)} | {gap} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    root = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/results")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/security.md")
    for name in ("models", "predictions"):
        table = load(root / f"robust-{name}")
        if not table:
            raise SystemExit(f"robust_report: expected results under {root}/robust-{name}")
        splice_markdown(markdown, f"robust-goal-{name}", render(table))
    print(f"robust_report: goal tables → {markdown}")


if __name__ == "__main__":
    main(sys.argv)
