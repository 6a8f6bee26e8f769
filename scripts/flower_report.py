"""Render the Flower measurements of `make bench-flower` as markdown tables.

Reads ``deployment.jsonl`` (scripts/flower_measure.sh), ``simulation.jsonl``
(scripts/flower_simulation.sh) and ``local.jsonl`` (``/usr/bin/time`` of the local runs) from
the results directory and splices the tables into ``docs/benchmarks/flower.md`` between the
``<!-- report:flower -->`` markers, so no figure there is written by hand.

Usage: python scripts/flower_report.py [RESULTS_DIR] [MARKDOWN]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from oneshotfl.runner.report import splice_markdown


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (one per line; blank lines skipped)."""
    if not path.is_file():
        raise SystemExit(f"flower_report: expected {path} (run `make bench-flower` first)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def deployment_table(rows: list[dict[str, Any]]) -> str:
    """One row per method. ``local`` is a reference that sends nothing in reality: we count
    0 bytes, while Flower still carries its models to the server for evaluation."""
    head = (
        "| method | test accuracy | our upload bytes (all clients) | flwr ls inbound | "
        "flwr ls outbound | Flower's extra bytes | Flower wall s | local process s | "
        "local run s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    body = ""
    for r in rows:
        extra = "–" if r["our_upload_bytes"] == 0 else f"{r['flwr_overhead_bytes']:,}"
        body += (
            f"| {r['method']} | {100 * r['accuracy']:.2f} | {r['our_upload_bytes']:,} | "
            f"{r['flwr_inbound_bytes']:,} | {r['flwr_outbound_bytes']:,} | {extra} | "
            f"{r['flower_wall_s']:.1f} | {r['local_wall_s']:.1f} | {r['local_run_s']:.1f} |\n"
        )
    return head + body


def simulation_table(sim: list[dict[str, Any]], local: list[dict[str, Any]]) -> str:
    by_clients = {int(r["clients"]): r for r in local}
    head = (
        "| clients | Flower wall s (submit → finished) | Flower peak RSS, SuperLink tree "
        "(MiB) | local wall s | local peak RSS (MiB) |\n|---:|---:|---:|---:|---:|\n"
    )
    body = ""
    for r in sim:
        n = int(r["clients"])
        loc = by_clients.get(n, {})
        rss = loc.get("local_peak_rss_kib")
        body += (
            f"| {n} | {r['wall_s']:.1f} | {r['peak_rss_mib']:,} | "
            f"{loc.get('local_wall_s', float('nan')):.1f} | "
            f"{'–' if rss is None else f'{rss / 1024:,.0f}'} |\n"
        )
    return head + body


def main(argv: list[str]) -> None:
    results = Path(argv[1] if len(argv) > 1 else "benchmarks/results/flower")
    markdown = Path(argv[2] if len(argv) > 2 else "docs/benchmarks/flower.md")
    text = (
        "Deployment: one SuperLink and 3 SuperNodes on loopback, insecure "
        f"(`{results}/deployment.jsonl`):\n\n"
        + deployment_table(read_lines(results / "deployment.jsonl"))
        + "\nSimulation engine against the local run at one thread "
        f"(`{results}/simulation.jsonl`, `{results}/local.jsonl`):\n\n"
        + simulation_table(
            read_lines(results / "simulation.jsonl"), read_lines(results / "local.jsonl")
        )
    )
    splice_markdown(markdown, "flower", text)
    print(text)


if __name__ == "__main__":
    main(sys.argv)
