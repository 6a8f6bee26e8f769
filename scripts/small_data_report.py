"""The small-data study's tables (issue 26): the initialisation and the step floor, on and off.

Reads the runs of ``benchmarks/small-data.yaml`` (``make bench-small-data``) and splices into
``docs/benchmarks/robustness.md`` between the ``small-data`` markers:

* the digits grid: a row per client model × optimiser, and for each ``init`` × ``local_steps``
  pair the test accuracy of FedOV, FedEOV and the plain ensemble (``centralized`` beside);
* every other run (the Python API's example, the shapes16 floor rows) as one row each.

Usage: ``python scripts/small_data_report.py [RESULTS_ROOT] [MARKDOWN]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from oneshotfl.runner.report import splice_markdown

SHOWN = ("fedov", "fedeov", "ensemble")
PAIRS = (("torch", 0), ("he", 0), ("torch", 300), ("he", 300))
"""(init, local_steps) column groups: the 0.1 defaults first, the 0.2 defaults last."""


def load(root: Path) -> list[dict[str, Any]]:
    """One record per run: its config and ``{method key: accuracy in %}``."""
    runs = []
    for file in sorted(root.glob("*/result.json")):
        doc = json.loads(file.read_text())
        acc = {m["key"]: 100 * float(m["accuracy"]) for m in doc["methods"]}
        runs.append({"config": doc["config"], "acc": acc})
    if not runs:
        raise SystemExit(f"small_data_report: expected runs under {root}, found none")
    return runs


def grid_table(runs: list[dict[str, Any]]) -> str:
    """The digits × disjoint grid: model × optimiser rows, init × floor column groups."""
    cell: dict[tuple[str, str, str, int], dict[str, float]] = {}
    for run in runs:
        c = run["config"]
        if c["dataset"] == "digits" and c["partition"] == "disjoint":
            cell[(c["model"], f"{c['optimizer']} {c['lr']:g}", c["init"], c["local_steps"])] = run[
                "acc"
            ]
    rows = sorted({(m, o) for m, o, _, _ in cell})
    head = " | ".join(
        f"`{init}`, {steps or 'no'} floor: FedOV / FedEOV / ens." for init, steps in PAIRS
    )
    lines = [f"| model · optimiser | {head} | centralized (he, 300) |", "|---|" + "---:|" * 5]
    for model, opt in rows:
        values = []
        for init, steps in PAIRS:
            acc = cell.get((model, opt, init, steps))
            values.append(" / ".join(f"{acc[k]:.1f}" for k in SHOWN) if acc else "–")
        best = cell.get((model, opt, "he", 300), {})
        central = f"{best['centralized']:.1f}" if "centralized" in best else "–"
        lines.append(f"| `{model}` · {opt} | " + " | ".join(values) + f" | {central} |")
    return "\n".join(lines)


def other_runs(runs: list[dict[str, Any]]) -> str:
    """The runs outside the grid, one row each."""
    lines = [
        "| run | local | fedavg | ensemble | fedov | fedeov | centralized |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        c, acc = run["config"], run["acc"]
        if c["dataset"] == "digits" and c["partition"] == "disjoint":
            continue
        name = Path(c["dataset"].split("path=")[-1]).stem if ":" in c["dataset"] else c["dataset"]
        label = (
            f"{name} · `{c['model']}` · {c['partition']} α={c['alpha']:g} · "
            f"{c['optimizer']} {c['lr']:g} · `{c['init']}` · {c['local_steps']} steps"
        )
        values = " | ".join(f"{acc[k]:.1f}" if k in acc else "–" for k in (
            "local", "fedavg", "ensemble", "fedov", "fedeov", "centralized"))  # fmt: skip
        lines.append(f"| {label} | {values} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path("benchmarks/results/small-data")
    markdown = Path(argv[1]) if len(argv) > 1 else Path("docs/benchmarks/robustness.md")
    runs = load(root)
    body = "\n\n".join(
        [
            f"Test accuracy (%), {len(runs)} runs, seed 0. Digits, disjoint, 5 clients, "
            "5 local epochs:",
            grid_table(runs),
            "The other runs (the Python API's example; the floor on shapes16):",
            other_runs(runs),
        ]
    )
    splice_markdown(markdown, "small-data", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
