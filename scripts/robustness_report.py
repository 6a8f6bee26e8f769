"""The robustness matrix's reading: every method on every dataset, model and partition.

Reads the runs of ``benchmarks/robustness.yaml`` (``make bench-robustness``; one run per
dataset × model × partition, every registered method in each) and:

* names every cell where a method ends more than ``TOLERANCE`` points below training alone
  (``local``) or the plain ensemble of the same client models (``ensemble``), on the method's
  own metric — personal accuracy for server-free methods (each client keeps its own model),
  test accuracy for the others, compared with the same metric of the references;
* matches each such cell with the method's declared known limits
  (``Method.known_limits``, printed by ``oneshotfl describe``); a cell that none covers is
  *unexplained*, and ``--check`` exits with status 1 naming it;
* writes ``matrix.csv`` beside the runs, a heatmap of each method against the ensemble
  (``docs/figures/NAME/matrix.png``) and splices the tables into ``docs/benchmarks/robustness.md``
  between the ``NAME`` markers, NAME being the results folder's name (``robustness``; the
  full-budget matrix of ``benchmarks/robustness-full.yaml``: ``robustness-full``).

With ``--against OTHER_ROOT`` (the same matrix at other budgets) it adds a table comparing
the two per method: mean metric over the cells, how far apart, and in how many cells each is
flagged below a reference.

Usage: ``python scripts/robustness_report.py [RESULTS_ROOT] [MARKDOWN] [--check]
[--against OTHER_ROOT]``.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oneshotfl.methods import METHODS, parse_method_spec
from oneshotfl.protocol.contract import Topology
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.runner.report import splice_markdown

TOLERANCE = 1.0
"""Points below a reference that count as level with it (one seed: run-to-run noise)."""
REFERENCES = ("local", "ensemble")
FIGURE = "../figures/{name}/matrix.png"
"""The heatmap, relative to the markdown file's folder (docs/benchmarks/); ``name`` is the results
folder's (``robustness``, ``robustness-full``), which also names the markdown markers."""


@dataclass(frozen=True)
class Cell:
    """One federation of the matrix."""

    dataset: str
    model: str
    partition: str

    def label(self) -> str:
        return f"{self.dataset} · {self.model} · {self.partition}"


@dataclass(frozen=True)
class Flag:
    """A method below a reference in one cell, and the limit that explains it (if any)."""

    method: str
    cell: Cell
    reference: str
    value: float
    reference_value: float
    limit: KnownLimit | None


def dataset_label(name: str) -> str:
    """``digits``, ``fashion_mnist``, or an npz/folder file's stem (``shapes16``)."""
    if ":" not in name:
        return name
    path = next((p.split("=", 1)[1] for p in name.split(":")[1:] if p.startswith("path=")), name)
    return Path(path).stem


def personalised(key: str) -> bool:
    """Server-free methods are measured by personal accuracy (each client keeps a model)."""
    cls = METHODS.get(parse_method_spec(key).name)
    return cls.requires.topology is Topology.PEER


def load(root: Path) -> dict[Cell, dict[str, float]]:
    """``cell → {method key: its metric in %}`` over every run under ``root``."""
    table: dict[Cell, dict[str, float]] = {}
    for file in sorted(root.glob("*/result.json")):
        doc = json.loads(file.read_text())
        config = doc["config"]
        cell = Cell(dataset_label(config["dataset"]), config["model"], config["partition"])
        rows: dict[str, float] = {}
        for method in doc["methods"]:
            rows[method["key"]] = 100 * float(method["accuracy"])
            if method.get("personal_accuracy") is not None:
                rows[method["key"] + "@personal"] = 100 * float(method["personal_accuracy"])
        rows.update(client_means(file.parent / "local.csv"))
        table[cell] = rows
    if not table:
        raise SystemExit(f"robustness_report: expected runs under {root}, found none")
    return table


CLIENTS = "@clients"
"""Suffix of a method's mean client-model test accuracy (``local.csv``) in a cell's rows."""


def client_means(path: Path) -> dict[str, float]:
    """``{method key + "@clients": mean test accuracy of its client models in %}``."""
    if not path.is_file():
        return {}
    accs: dict[str, list[float]] = defaultdict(list)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            accs[row["method"]].append(float(row["local_test_accuracy"]))
    return {key + CLIENTS: 100 * sum(v) / len(v) for key, v in accs.items() if v}


def clients_weaker(rows: dict[str, float], key: str, weak_clients: bool) -> bool:
    """No such condition, or the method's client models are below the plain ones here."""
    if not weak_clients:
        return True
    mine, plain = rows.get(key + CLIENTS), rows.get("local" + CLIENTS)
    return mine is not None and plain is not None and mine < plain - TOLERANCE


def metric(rows: dict[str, float], key: str, personal: bool) -> float:
    return rows[key + "@personal"] if personal else rows[key]


def flags(table: dict[Cell, dict[str, float]]) -> list[Flag]:
    """Every (method, cell, reference) where the method is below the reference."""
    out: list[Flag] = []
    for cell, rows in table.items():
        for key in rows:
            if "@" in key or key in REFERENCES:
                continue
            personal = personalised(key)
            value = metric(rows, key, personal)
            limits = METHODS.get(parse_method_spec(key).name).known_limits
            options = key.partition(":")[2]
            for ref in REFERENCES:
                ref_value = metric(rows, ref, personal)
                if value < ref_value - TOLERANCE:
                    limit = next(
                        (
                            lim
                            for lim in limits
                            if lim.covers(ref, *astuple(cell), options)
                            and bound_below(rows, lim.bound, ref, personal)
                            and clients_weaker(rows, key, lim.weak_clients)
                        ),
                        None,
                    )
                    out.append(Flag(key, cell, ref, value, ref_value, limit))
    return out


def bound_below(rows: dict[str, float], bound: str | None, ref: str, personal: bool) -> bool:
    """No bound, or the bound itself is below the reference in this cell."""
    if bound is None:
        return True
    if bound not in rows:
        return False
    return metric(rows, bound, personal) < metric(rows, ref, personal) - TOLERANCE


def astuple(cell: Cell) -> tuple[str, str, str]:
    return cell.dataset, cell.model, cell.partition


def matrix_tables(table: dict[Cell, dict[str, float]], found: list[Flag]) -> str:
    """Per dataset, one table: a row per method, a column per model × partition."""
    marked: dict[tuple[str, Cell], Flag] = {}
    for f in found:  # an unexplained flag wins the cell's mark over an explained one
        if (f.method, f.cell) not in marked or f.limit is None:
            marked[(f.method, f.cell)] = f
    methods = sorted({k for rows in table.values() for k in rows if "@" not in k})
    parts = []
    for dataset in sorted({c.dataset for c in table}):
        cells = sorted((c for c in table if c.dataset == dataset), key=astuple)
        head = "| method | " + " | ".join(f"{c.model} · {c.partition}" for c in cells) + " |"
        lines = [f"**{dataset}**", "", head, "|---|" + "---:|" * len(cells)]
        for key in methods:
            personal = personalised(key)
            values = []
            for c in cells:
                rows = table[c]
                if key not in rows:
                    values.append("–")
                    continue
                flag = marked.get((key, c))
                mark = "" if flag is None else (" ○" if flag.limit else " ✗")
                values.append(f"{metric(rows, key, personal):.1f}{mark}")
            name = f"`{key}`" + (" (personal)" if personal else "")
            lines.append(f"| {name} | " + " | ".join(values) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def flag_list(found: list[Flag]) -> str:
    """The cells below a reference, grouped by method, with the limit that covers each."""
    by_method: dict[str, list[Flag]] = defaultdict(list)
    for f in found:
        by_method[f.method].append(f)
    lines = []
    for key in sorted(by_method):
        items = by_method[key]
        unexplained = [f for f in items if f.limit is None]
        lines.append(
            f"- `{key}`: {len(items)} cell(s) below a reference"
            + (f", **{len(unexplained)} unexplained**" if unexplained else "")
        )
        for limit in dict.fromkeys(f.limit for f in items if f.limit is not None):
            count = sum(1 for f in items if f.limit == limit)
            lines.append(f"  - {count} × {limit.scope()}: {limit.why}")
        for f in unexplained:
            lines.append(
                f"  - ✗ {f.cell.label()}: {f.value:.1f} against {f.reference} "
                f"{f.reference_value:.1f}"
            )
    return "\n".join(lines) or "- none"


def write_csv(table: dict[Cell, dict[str, float]], path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["dataset", "model", "partition", "method", "metric", "value"])
        for cell in sorted(table, key=astuple):
            for key, value in sorted(table[cell].items()):
                name, _, personal = key.partition("@")
                writer.writerow([*astuple(cell), name, personal or "accuracy", f"{value:.4f}"])


def heatmap(table: dict[Cell, dict[str, float]], found: list[Flag], path: Path) -> None:
    """Each method's metric minus the ensemble's, per cell (red below, blue above)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = sorted(table, key=astuple)
    methods = sorted({k for r in table.values() for k in r if "@" not in k})
    grid = np.full((len(methods), len(cells)), np.nan)
    for j, c in enumerate(cells):
        for i, key in enumerate(methods):
            if key in table[c]:
                personal = personalised(key)
                grid[i, j] = metric(table[c], key, personal) - metric(
                    table[c], "ensemble", personal
                )
    fig, ax = plt.subplots(figsize=(0.36 * len(cells) + 3, 0.26 * len(methods) + 2))
    image = ax.imshow(grid, cmap="RdBu", vmin=-50, vmax=50, aspect="auto")
    unexplained = {(f.method, f.cell) for f in found if f.limit is None}
    for i, key in enumerate(methods):
        for j, c in enumerate(cells):
            if (key, c) in unexplained:
                ax.text(j, i, "✗", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(cells)), [c.label() for c in cells], rotation=90, fontsize=6)
    ax.set_yticks(range(len(methods)), methods, fontsize=7)
    fig.colorbar(image, ax=ax, label="points against the plain ensemble")
    ax.set_title("robustness matrix: each method minus the ensemble (personal: peer methods)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def method_seconds(method: dict[str, Any]) -> float:
    """A method's own compute in one run: its server time, its clients' own training and,
    for peer methods, every receiver's aggregation (shared client training is not counted)."""
    total = float(method.get("server_wall_s") or 0.0)
    for key in ("client_own_s", "receiver_wall_s"):
        total += sum(float(v) for v in method.get(key) or [])
    return total


def timing(root: Path, top: int = 6) -> str:
    """The runs' wall time (as recorded in each ``result.json``) and the costliest methods."""
    wall, hits, misses = 0.0, 0, 0
    per_method: dict[str, float] = defaultdict(float)
    files = sorted(root.glob("*/result.json"))
    for file in files:
        doc = json.loads(file.read_text())
        wall += float(doc.get("wall_time_s") or 0.0)
        cache = doc.get("cache") or {}
        hits, misses = hits + int(cache.get("hits", 0)), misses + int(cache.get("misses", 0))
        for method in doc["methods"]:
            per_method[parse_method_spec(method["key"]).name] += method_seconds(method)
    costly = sorted(per_method.items(), key=lambda kv: -kv[1])[:top]
    names = ", ".join(f"`{name}` {seconds / 60:.0f} min" for name, seconds in costly)
    return (
        f"Time: the {len(files)} runs' recorded wall times sum to {wall / 60:.0f} min on one "
        f"thread each (two shards: about {wall / 120:.0f} min), with {hits} client-artefact "
        f"cache hits and {misses} misses. The costliest methods (own compute over every run): "
        f"{names}."
    )


def labels(rows: dict[str, float]) -> dict[str, str]:
    """``method key → label``: the method's name, so one method at two budgets lines up
    (``fedkt``, ``fedkt:partitions=1``), or the key where a cell runs the method twice
    (``ensemble``, ``ensemble:combine=logits``)."""
    keys = [k for k in rows if "@" not in k]
    names = [parse_method_spec(k).name for k in keys]
    return {k: n if names.count(n) == 1 else k for k, n in zip(keys, names, strict=True)}


def by_label(
    table: dict[Cell, dict[str, float]],
) -> tuple[dict[tuple[str, Cell], float], set[tuple[str, Cell]]]:
    """``(label, cell) → metric`` and the ``(label, cell)`` pairs flagged below a reference."""
    named = {cell: labels(rows) for cell, rows in table.items()}
    values = {
        (label, cell): metric(table[cell], key, personalised(key))
        for cell, keys in named.items()
        for key, label in keys.items()
    }
    flagged = {(named[f.cell][f.method], f.cell) for f in flags(table)}
    return values, flagged


def budget_comparison(
    table: dict[Cell, dict[str, float]], other: dict[Cell, dict[str, float]], name: str
) -> str:
    """Per method, this matrix against ``other`` (the same cells at other budgets)."""
    (mine, flagged), (theirs, flagged_there) = by_label(table), by_label(other)
    lines = [
        f"| method | mean here | mean in `{name}` | mean Δ | largest \\|Δ\\| "
        "| cells flagged here | cells flagged there |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    changed = 0
    for label in sorted({k for k, _ in mine}):
        cells = [c for (k, c) in mine if k == label and (k, c) in theirs]
        if not cells:
            continue
        delta = [mine[(label, c)] - theirs[(label, c)] for c in cells]
        here = sum((label, c) in flagged for c in cells)
        there = sum((label, c) in flagged_there for c in cells)
        changed += sum(((label, c) in flagged) != ((label, c) in flagged_there) for c in cells)
        mean_here = sum(mine[(label, c)] for c in cells) / len(cells)
        mean_there = sum(theirs[(label, c)] for c in cells) / len(cells)
        lines.append(
            f"| `{label}` | {mean_here:.1f} | {mean_there:.1f} | {sum(delta) / len(delta):+.1f} "
            f"| {max(abs(d) for d in delta):.1f} | {here} | {there} |"
        )
    head = (
        f"Against `{name}` (the same cells at other budgets; a method's cells are flagged when "
        f"it is below `local` or `ensemble` there): {changed} (method, cell) pairs change "
        "between flagged and not flagged."
    )
    return head + "\n\n" + "\n".join(lines)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    against = None
    if "--against" in argv:
        at = argv.index("--against")
        if at + 1 >= len(argv):
            raise SystemExit("robustness_report: expected a results folder after --against")
        against = Path(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    args = [a for a in argv if a != "--check"]
    root = Path(args[0]) if args else Path("benchmarks/results/robustness")
    markdown = Path(args[1]) if len(args) > 1 else Path("docs/benchmarks/robustness.md")
    table = load(root)
    missing = sorted(set(METHODS.names()) - {parse_method_spec(k).name for r in table.values()
                                             for k in r})  # fmt: skip
    found = flags(table)
    write_csv(table, root / "matrix.csv")
    heatmap(table, found, markdown.parent / FIGURE.format(name=root.name))
    unexplained = [f for f in found if f.limit is None]
    summary = (
        f"{len(table)} federations, {len(METHODS.names()) - len(missing)} of "
        f"{len(METHODS.names())} registered methods; {len(found)} (method, cell, reference) "
        f"triples more than {TOLERANCE:g} point below `local` or `ensemble`, "
        f"{len(found) - len(unexplained)} covered by a documented known limit (○), "
        f"{len(unexplained)} unexplained (✗)."
    )
    body = "\n\n".join(
        [
            summary,
            timing(root),
            matrix_tables(table, found),
            "Cells below a reference:",
            flag_list(found),
        ]
        + ([] if against is None else [budget_comparison(table, load(against), against.name)])
    )
    splice_markdown(markdown, root.name, body)
    print(summary)
    if missing:
        print(f"robustness_report: methods missing from the matrix: {missing}")
    for f in unexplained:
        print(f"unexplained: {f.method} on {f.cell.label()}: {f.value:.1f} < {f.reference} "
              f"{f.reference_value:.1f}")  # fmt: skip
    return 1 if check and (unexplained or missing) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
