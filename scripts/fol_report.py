"""Render FOL's tables (issue 14) from committed sweep results.

Reads ``benchmarks/results/fol-fmnist`` (the server-free methods over ψ, two graphs and E),
``fol-references`` (the global references on the same federations) and ``fol-ablation``, and
splices between markers of ``docs/benchmarks/personalisation.md``:

* ``fol-table`` — the Tables 1/2 analogue, one table per graph: each method's personal
  accuracy (its model on the test split re-weighted to each client's own label distribution)
  as each seed's mean over its clients, mean ± the 95% half-width over seeds, per ψ; the
  global references repeat in both tables.
* ``fol-order`` — how often the paper's ordering FOL-A > FOL > FOL-AN > FOL-N holds, per pair,
  over every (graph, ψ, E, seed), and per E.
* ``fol-claims`` — the differences the reading cites (FOL against ``local``, FedAvg with
  E = 3 rounds and the ensemble; what more rounds and the pruning buy), per ψ and graph: the
  mean over seeds and the smallest and largest seed.
* ``fol-clients`` — the per-client table (the paper's "Satellite #" columns) at ψ = 0.7 on
  the ring: each client's personal accuracy, mean ± the 95% half-width over seeds.
* ``fol-cost`` — bytes each client sends and receives, and the measured cost of FOL's stages
  per client: seconds to align one received model (fine-tune, prune, post-tune) and to
  distil one round (measured when the stage was computed; a cache hit repeats the figure).
* ``fol-ablation-table`` — what each stage buys, with each row's difference to the full
  method per seed.

It also writes ``docs/figures/fol-fmnist/fol_table.csv``. Usage:
``python scripts/fol_report.py [RESULTS_ROOT] [MARKDOWN]``.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from oneshotfl.intervals import mean_interval
from oneshotfl.runner.report import splice_markdown
from oneshotfl.runner.report_tables import interval_cell

PSIS = (0.7, 0.5, 0.3, 0.1)
GRAPHS = {"ring": "ring", "random:degree=3": "random degree-3 graph"}
VARIANTS = (("fol-a", "FOL-A"), ("fol", "FOL"), ("fol-an", "FOL-AN"), ("fol-n", "FOL-N"))
REFERENCES = (
    ("dense", "DENSE"),
    ("co_boosting", "Co-Boosting"),
    ("fedavg", "FedAvg (E=1)"),
    ("fedavg_rounds:rounds=2", "FedAvg (E=2)"),
    ("fedavg_rounds:rounds=3", "FedAvg (E=3)"),
    ("fedeov", "FedEOV"),
    ("ensemble", "Ensemble"),
)
Doc = dict[str, Any]


def load(directory: Path) -> list[Doc]:
    return [json.loads(f.read_text()) for f in sorted(directory.glob("*/result.json"))]


def label(key: str) -> str:
    """A table row name for a method key."""
    match = re.fullmatch(r"(fol(?:-an|-a|-n)?):rounds=(\d)", key)
    if match:
        name = dict(VARIANTS)[match.group(1)]
        return f"{name} (E={match.group(2)})"
    for prefix, name in REFERENCES:
        if key == prefix or (key.startswith(prefix + ":") and prefix != "fedavg"):
            return name
    return {"local": "Local", "peer_ensemble": "Neighbourhood ensemble"}.get(key, key)


def row_order() -> list[str]:
    rows = ["Local"]
    for _, name in VARIANTS:
        rows += [f"{name} (E={e})" for e in (1, 2, 3)]
    return rows + ["Neighbourhood ensemble"] + [name for _, name in REFERENCES]


Seeds = list[dict[int, float]]
"""Per seed, client id → personal accuracy (%)."""


def by_client(method: Doc) -> dict[int, float]:
    """A method's personal accuracy per client id (%); clients without one are left out."""
    values = method.get("client_personal_accuracy") or []
    clients = method.get("clients_used") or list(range(len(values)))
    if len(clients) != len(values):  # a global model lists every client of the federation
        clients = list(range(len(values)))
    return {c: 100 * v for c, v in zip(clients, values, strict=True) if v == v}  # v == v: no NaN


def is_peer(doc: Doc) -> bool:
    return any("topology" in m for m in doc["methods"])


def personal(docs: Iterable[Doc]) -> dict[tuple[str, float, str], Seeds]:
    """(row, ψ, graph or "") → per seed, the clients' personal accuracies (%)."""
    out: dict[tuple[str, float, str], Seeds] = defaultdict(list)
    for doc in docs:
        cfg = doc["config"]
        graph = cfg["graph"] if is_peer(doc) else ""
        for m in doc["methods"]:
            out[(label(m["key"]), float(cfg["psi"]), graph)].append(by_client(m))
    return out


def cell(seeds: Seeds) -> str:
    """Each seed's mean over its clients, then their mean ± the half-width of the 95%
    t-interval over the seeds (n = seeds)."""
    return interval_cell(mean_interval(statistics.fmean(s.values()) for s in seeds if s), 1.0)


def main_tables(peer: list[Doc], refs: list[Doc], csv_path: Path) -> str:
    values = personal([*peer, *refs])
    parts, records = [], []
    for graph, title in GRAPHS.items():
        lines = [
            f"**{title}** — personal accuracy % (each seed's mean over its clients), mean ± "
            "the half-width of its 95% t-interval over seeds:",
            "",
            "| method | " + " | ".join(f"ψ = {p}" for p in PSIS) + " |",
            "|---|" + "---:|" * len(PSIS),
        ]
        for row in row_order():
            cells = []
            for psi in PSIS:
                seeds = values.get((row, psi, graph)) or values.get((row, psi, ""), [])
                cells.append(cell(seeds))
                pooled = [v for s in seeds for v in s.values()]
                if pooled:
                    records.append([title, row, psi, statistics.fmean(pooled), len(seeds)])
            if any(c != "–" for c in cells):
                lines.append(f"| {row} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["graph", "method", "psi", "personal_accuracy_mean", "seeds"])
        writer.writerows(records)
    return "\n\n".join(parts)


def run_means(doc: Doc) -> dict[str, float]:
    """A run's personal accuracy (%) per method key: the mean over its clients."""
    return {m["key"]: statistics.fmean(by_client(m).values()) for m in doc["methods"]}


def order_table(peer: list[Doc]) -> str:
    """How often each adjacent pair of the paper's ordering holds (mean over clients), per
    number of collection rounds E and in all."""
    wins: dict[tuple[str, str], dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    full: dict[int, list[bool]] = defaultdict(list)
    for doc in peer:
        acc = run_means(doc)
        for e in (1, 2, 3):
            keys = [f"{v}:rounds={e}" for v, _ in VARIANTS]
            if not all(k in acc for k in keys):
                continue
            pairs = list(itertools.pairwise(acc[k] for k in keys))
            for (a, b), (x, y) in zip(pairs, itertools.pairwise(VARIANTS), strict=True):
                wins[(x[1], y[1])][e].append(a > b)
            full[e].append(all(a > b for a, b in pairs))
    rounds = (1, 2, 3)
    lines = [
        "| pair | " + " | ".join(f"E = {e}" for e in rounds) + " | holds in | of |",
        "|---|" + "---:|" * (len(rounds) + 2),
    ]
    rows = [*((f"{x} > {y}", by_e) for (x, y), by_e in wins.items()), ("the whole chain", full)]
    for name, by_e in rows:
        per_e = [f"{sum(by_e[e])}/{len(by_e[e])}" for e in rounds]
        held = [h for e in rounds for h in by_e[e]]
        lines.append(f"| {name} | " + " | ".join(per_e) + f" | {sum(held)} | {len(held)} |")
    return "\n".join(lines)


CLAIMS = (
    ("FOL (E=3) − Local", ("fol:rounds=3",), ("local",)),
    ("FOL (E=3) − FedAvg (E=3)", ("fol:rounds=3",), ("fedavg_rounds:rounds=3",)),
    ("FOL (E=3) − Ensemble", ("fol:rounds=3",), ("ensemble",)),
    ("FOL (E=3) − FOL (E=1)", ("fol:rounds=3",), ("fol:rounds=1",)),
    ("FOL-A (E=3) − FOL-A (E=1)", ("fol-a:rounds=3",), ("fol-a:rounds=1",)),
    ("FOL-N (E=3) − FOL-N (E=1)", ("fol-n:rounds=3",), ("fol-n:rounds=1",)),
    ("FOL-AN (E=3) − FOL-AN (E=1)", ("fol-an:rounds=3",), ("fol-an:rounds=1",)),
    (
        "pruning at E=3: FOL, FOL-A − FOL-N, FOL-AN",
        ("fol:rounds=3", "fol-a:rounds=3"),
        ("fol-n:rounds=3", "fol-an:rounds=3"),
    ),
    ("Neighbourhood ensemble − Local", ("peer_ensemble",), ("local",)),
)
"""The differences the reading cites: (row, keys averaged, keys averaged and subtracted)."""


def claims_table(peer: list[Doc], refs: list[Doc]) -> str:
    """The reading's comparisons, in points of personal accuracy, per ψ and graph: the paired
    difference over seeds, mean [95% t-interval] (the same federations: one run holds both);
    then how often FOL's variants beat ``local``."""
    ref_acc = {(d["config"]["psi"], d["config"]["seed"]): run_means(d) for d in refs}
    diffs: dict[tuple[str, float, str], list[float]] = defaultdict(list)
    above, cells = 0, 0
    for doc in peer:
        cfg = doc["config"]
        acc = {**ref_acc.get((cfg["psi"], cfg["seed"]), {}), **run_means(doc)}
        for name, plus, minus in CLAIMS:
            if all(k in acc for k in (*plus, *minus)):
                value = statistics.fmean(acc[k] for k in plus)
                value -= statistics.fmean(acc[k] for k in minus)
                diffs[(name, float(cfg["psi"]), cfg["graph"])].append(value)
        for key, value in acc.items():
            if re.fullmatch(r"fol(-an|-a|-n)?:rounds=\d", key):
                above, cells = above + (value > acc["local"]), cells + 1
    columns = [(psi, graph) for psi in PSIS for graph in GRAPHS]
    head = [f"ψ = {psi} {'ring' if graph == 'ring' else 'degree 3'}" for psi, graph in columns]
    lines = ["| points | " + " | ".join(head) + " |", "|---|" + "---:|" * len(columns)]
    for name, _, _ in CLAIMS:
        row = []
        for psi, graph in columns:
            values = diffs.get((name, psi, graph), [])
            found = mean_interval(values)
            row.append(found.bracket() if found.n else "–")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += ["", f"FOL's variants (every E) above `local`: {above} of {cells} runs × variants."]
    return "\n".join(lines)


def clients_table(peer: list[Doc], refs: list[Doc], psi: float = 0.7, graph: str = "ring") -> str:
    per: dict[str, Seeds] = defaultdict(list)
    for doc in [*peer, *refs]:
        cfg = doc["config"]
        if float(cfg["psi"]) != psi or (is_peer(doc) and cfg["graph"] != graph):
            continue
        for m in doc["methods"]:
            if m["key"] == "local" and not is_peer(doc):
                continue
            per[label(m["key"])].append(by_client(m))
    if not per:
        return "No results yet."
    n = 1 + max(c for seeds in per.values() for s in seeds for c in s)
    lines = [
        "| method | " + " | ".join(f"client {k}" for k in range(n)) + " |",
        "|---|" + "---:|" * n,
    ]
    for row in row_order():
        seeds = per.get(row)
        if not seeds:
            continue
        cells = []
        for k in range(n):
            found = mean_interval(s[k] for s in seeds if k in s)
            if not found.n:
                cells.append("–")
            elif not found.available:
                cells.append(f"{found.mean:.1f}")
            else:
                cells.append(f"{found.mean:.1f} ± {found.half_width:.1f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(peer: list[Doc], refs: list[Doc]) -> str:
    sent: dict[str, list[float]] = defaultdict(list)
    got: dict[str, list[float]] = defaultdict(list)
    align: dict[str, list[float]] = defaultdict(list)
    distil: dict[str, list[float]] = defaultdict(list)
    for doc in [*peer, *refs]:
        n = doc["config"]["clients"]
        for m in doc["methods"]:
            row = label(m["key"])
            sent[row].append(sum(m["upload_bytes_per_client"]) / n / 1024)
            received = m.get("received_bytes_per_client")
            if received is None:  # a star method: the server's broadcast per client
                received = [m["download_bytes_per_client"]] * n
            got[row].append(sum(received) / n / 1024)
            for diag in (m.get("diagnostics") or {}).values():
                timings = diag.get("timings", {}) if isinstance(diag, dict) else {}
                for name, seconds in timings.items():
                    (align if name.startswith("align") else distil)[row].append(seconds)
    lines = [
        "| method | sent KiB / client | received KiB / client | s to align one model "
        "| s to distil one round |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in row_order():
        if row not in sent:
            continue
        a = f"{statistics.fmean(align[row]):.2f}" if align[row] else "–"
        d = f"{statistics.fmean(distil[row]):.2f}" if distil[row] else "–"
        lines.append(
            f"| {row} | {statistics.fmean(sent[row]):.1f} | {statistics.fmean(got[row]):.1f} "
            f"| {a} | {d} |"
        )
    return "\n".join(lines)


def ablation_table(docs: list[Doc], full: str = "fol-a:rounds=3") -> str:
    """What each stage buys: personal accuracy per row, and its difference to the ``full``
    method in each seed (points, seeds in order)."""
    if not docs:
        return "No results yet (`make bench-fol`)."
    docs = sorted(docs, key=lambda d: d["config"]["seed"])
    per: dict[str, Seeds] = defaultdict(list)
    for doc in docs:
        for m in doc["methods"]:
            per[m["key"]].append(by_client(m))
    means = [run_means(d) for d in docs]
    lines = [
        "| row | personal accuracy % (mean ± 95% half-width over seeds) "
        f"| against `{full}`, per seed | paired, mean [95% interval] |",
        "|---|---:|---:|---:|",
    ]
    for key, seeds in per.items():
        gaps = [m[key] - m[full] for m in means if key in m and full in m]
        against = " / ".join(f"{g:+.2f}" for g in gaps)
        paired = mean_interval(gaps).bracket() if key != full and gaps else "–"
        lines.append(f"| `{key}` | {cell(seeds)} | {against or '–'} | {paired} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    root = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/results")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/personalisation.md")
    peer, refs = load(root / "fol-fmnist"), load(root / "fol-references")
    if not peer:
        raise SystemExit(f"fol_report: expected results under {root / 'fol-fmnist'}")
    csv_path = Path("docs/figures/fol-fmnist/fol_table.csv")
    splice_markdown(markdown, "fol-table", main_tables(peer, refs, csv_path))
    splice_markdown(markdown, "fol-order", order_table(peer))
    splice_markdown(markdown, "fol-claims", claims_table(peer, refs))
    splice_markdown(markdown, "fol-clients", clients_table(peer, refs))
    splice_markdown(markdown, "fol-cost", cost_table(peer, refs))
    splice_markdown(markdown, "fol-ablation-table", ablation_table(load(root / "fol-ablation")))
    print(f"fol_report: {len(peer)} peer runs, {len(refs)} reference runs → {markdown}")


if __name__ == "__main__":
    main(sys.argv)
