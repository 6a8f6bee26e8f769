"""Render "FOL against local at the library's defaults" (issue 36) from committed results.

Reads ``benchmarks/results/fol-defaults`` (digits, a 3 000-image Fashion-MNIST subset and the
breast-cancer table, with and without the 300-step floor, 5 seeds) and
``benchmarks/results/fol-defaults-fmnist`` (full Fashion-MNIST at the defaults, 5 seeds) and
splices the table ``fol-defaults-table`` into ``docs/benchmarks/personalisation.md``: per
federation and budget, each method's personal accuracy (mean over seeds of the mean over
clients, %), the share of FOL's teacher weight on the client's own model (mean over clients
and seeds, round 1), and the paired differences (mean [95% t-interval] over the seeds, points)
that decide the defaults: FOL − local, and each reading of the stage-3 weights − FOL's default.

Usage: ``python scripts/fol_defaults_report.py [RESULTS_ROOT] [MARKDOWN]``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from oneshotfl.intervals import difference_words, paired_difference
from oneshotfl.runner.report import splice_markdown

COLUMNS = (
    ("local", "Local"),
    ("fol", "FOL"),
    ("fol-a", "FOL-A"),
    ("fol:weights=uniform", "FOL, uniform weights"),
    ("fol:weight_split=val", "FOL, weights fitted on val"),
    ("peer_ensemble", "Neighbourhood ensemble"),
)
PAIRS = (
    ("fol", "local", "FOL − local"),
    ("fol:weights=uniform", "fol", "uniform weights − FOL"),
    ("fol:weight_split=val", "fol", "weights fitted on val − FOL"),
    ("fol-a", "fol", "FOL-A − FOL"),
)
"""The paired differences the table gives: (a, b, heading) for a − b over the seeds."""
Doc = dict[str, Any]


def federation(doc: Doc) -> str:
    """The row name: the dataset (a file's stem) and the client budget."""
    cfg = doc["config"]
    name = str(cfg["dataset"])
    if name.startswith("csv:"):
        name = Path(name.split("path=", 1)[1].split(":", 1)[0]).stem + " (CSV table, mlp)"
    elif cfg.get("max_train"):
        name += f" ({cfg['max_train']} images)"
    floor = "300-step floor (default)" if cfg["local_steps"] == 300 else "no floor"
    if cfg["local_steps"] not in (0, 300):
        floor = f"{cfg['local_steps']}-step floor"
    return f"{name}, {cfg['clients']} clients, {floor}"


def own_weight(method: Doc) -> list[float]:
    """Per client, the weight FOL's round-1 teacher puts on the client's own model."""
    shares = []
    for client, info in method.get("diagnostics", {}).items():
        if isinstance(info, dict) and info.get("rounds"):
            first = info["rounds"][0]
            chosen = first["top_k"]
            own = int(client)
            shares.append(first["weights"][chosen.index(own)] if own in chosen else 0.0)
    return shares


def paired(a: dict[int, float], b: dict[int, float]) -> str:
    """``+mean [low, high]`` of ``a − b`` over the seeds both ran, and its words where it is
    measurable."""
    found, _ = paired_difference(a, b)
    if not found.available:
        return f"{found.mean:+.2f} (1 seed)"
    words = difference_words(found)
    return found.bracket() + ("" if words.startswith("no") else f" ({words})")


def table(docs: list[Doc]) -> str:
    acc: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    weight: dict[str, list[float]] = defaultdict(list)
    for doc in docs:
        row = federation(doc)
        means = {m["key"]: 100 * m["personal_accuracy"] for m in doc["methods"]}
        for key, value in means.items():
            acc[row][key][int(doc["config"]["seed"])] = value
        fol = next(m for m in doc["methods"] if m["key"] == "fol")
        weight[row] += own_weight(fol)
    head = ["Federation, budget", *(name for _, name in COLUMNS), "Own model's weight"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    diffs = ["| Federation, budget | " + " | ".join(h for _, _, h in PAIRS) + " |"]
    diffs.append("|---" + "|---:" * len(PAIRS) + "|")
    for row in sorted(acc):
        n = len(acc[row]["fol"])
        seeds = f"{n} seed{'s' if n > 1 else ''}"
        cells = [f"{statistics.fmean(acc[row][k].values()):.2f}" for k, _ in COLUMNS]
        cells.append(f"{100 * statistics.fmean(weight[row]):.0f}%")
        lines.append(f"| {row} ({seeds}) | " + " | ".join(cells) + " |")
        gaps = [paired(acc[row][a], acc[row][b]) for a, b, _ in PAIRS]
        diffs.append(f"| {row} ({seeds}) | " + " | ".join(gaps) + " |")
    env = docs[0]["environment"]
    where = f"{env['cpu']} ({env['cpu_id']}), torch {env['torch']}, {env['threads']} thread(s)"
    lines += ["", f"Personal accuracy in %; recorded on {where}.", ""]
    lines += [
        "Paired differences in points, mean [95% t-interval] over the seeds (the same "
        "federations); no words where the interval includes 0 (no measurable difference):",
        "",
        *diffs,
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    root = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/results")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/personalisation.md")
    docs = [
        json.loads(f.read_text())
        for name in ("fol-defaults", "fol-defaults-fmnist")
        for f in sorted((root / name).glob("*/result.json"))
    ]
    if not docs:
        raise SystemExit(f"fol_defaults_report: expected results under {root / 'fol-defaults'}")
    text = table(docs)
    splice_markdown(markdown, "fol-defaults-table", text)
    print(text)


if __name__ == "__main__":
    main(sys.argv)
