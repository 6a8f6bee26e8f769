"""Render `make bench-flower-scale` (scripts/bench_flower_scale.sh) as a markdown table.

Reads ``simulation.jsonl``, ``cluster.jsonl``, ``local.jsonl`` and ``machine.json`` from the
results directory and splices the table between the ``<!-- report:flower-scale -->`` markers
of ``docs/benchmarks/flower.md``: no figure there is written by hand.

Usage: python scripts/flower_scale_report.py [RESULTS_DIR] [MARKDOWN] [SECTION]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from oneshotfl.runner.report import splice_markdown


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file ([] when it is absent)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def row(kind: str, sim: dict[str, Any], local: dict[str, Any]) -> str:
    """One table row: a Flower run against the local run of the same client count."""
    n = sim["clients"]
    extra_ms = (sim["wall_s"] - local["wall_s"]) / n * 1000
    places = sim.get("clients_per_place") or {}
    spread = " + ".join(str(c) for c in sorted(places.values(), reverse=True)) or "–"
    return (
        f"| {n:,} | {kind} | {sim['wall_s']:.1f} | {local['wall_s']:.1f} | "
        f"{sim['wall_s'] / local['wall_s']:.2f}× | {extra_ms:+.0f} | "
        f"{sim['peak_pss_mib']:,} | {local['peak_pss_mib']:,} | "
        f"{sim['peak_pss_mib'] / local['peak_pss_mib']:.2f}× | {sim['peak_rss_mib']:,} | "
        f"{local['upload_bytes']:,} | {spread} |\n"
    )


def cohorts(sim: dict[str, Any]) -> str:
    """How a run's virtual clients went to its SuperNodes: one each, or in cohorts."""
    size = sim.get("cohort_size", 0)
    if not size:
        return ", a client per message"
    return f", cohorts of {size} ({sim['supernodes']:,} SuperNodes)"


def table(results: Path) -> str:
    local = {r["clients"]: r for r in read_lines(results / "local.jsonl")}
    head = (
        "| clients | Flower run | Flower wall s | local wall s | time ratio | Flower's extra ms "
        "per client | Flower peak PSS (MiB) | local peak PSS (MiB) | memory ratio (PSS) | "
        "Flower summed RSS (MiB) | upload bytes (both) | clients per Ray node |\n"
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    body = ""
    for sim in read_lines(results / "simulation.jsonl"):
        cpus = sim.get("cpus_per_client", 1)
        kind = "1 Ray worker (2 CPUs per client)" if cpus == 2 else "2 Ray workers (1 CPU each)"
        body += row(kind + cohorts(sim), sim, local[sim["clients"]])
    for sim in read_lines(results / "cluster.jsonl"):
        body += row("Ray cluster: 2 nodes × 1 CPU" + cohorts(sim), sim, local[sim["clients"]])
    machine = json.loads((results / "machine.json").read_text())
    return (
        f"Measured on {machine['cpu']} ({machine['cores']} cores, {machine['memory_gib']} GiB), "
        f"Python {machine['python']}, torch {machine['torch']}, flwr {machine['flwr']}, "
        f"Ray {machine['ray']}; settings `{machine['settings']}`; every Flower result equal to "
        f"the local one (`oneshotfl compare`, run by the script). From "
        f"`{results}/simulation.jsonl`, `cluster.jsonl` and `local.jsonl`:\n\n" + head + body
    )


def main(argv: list[str]) -> None:
    results = Path(argv[1] if len(argv) > 1 else "benchmarks/results/flower-scale")
    markdown = Path(argv[2] if len(argv) > 2 else "docs/benchmarks/flower.md")
    section = argv[3] if len(argv) > 3 else "flower-scale"
    text = table(results)
    splice_markdown(markdown, section, text)
    print(text)


if __name__ == "__main__":
    main(sys.argv)
