"""Clients in parallel: one federation at 1 and 2 worker processes, side by side on this machine.

Each run starts from no cache (every client trains), with one torch thread per client step;
the results must be identical (``oneshotfl compare``). A third run is the sequential runner
as it was before the pool: one process, every client step on all the cores' threads
(``client_threads`` = the torch thread count) — its numbers may differ in the last bits (another
thread count), so it is timed, not compared. From the two wall times, Amdahl's law
gives the serial fraction f — the part that does not shrink with workers (data loading, the
server's aggregation, evaluation, starting the workers) — as f = 2·t₂/t₁ − 1, and the speedup
on N cores as 1 / (f + (1 − f)/N). Writes ``benchmarks/results/workers/scaling.json`` and
splices the table into ``docs/benchmarks/speed.md`` (section ``workers``).

Usage: ``python scripts/bench_workers.py [CONFIG.yaml] [key=value ...]`` (default: the
federation below). Run it on an otherwise idle machine with at least two cores.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from helpers import run_config
from oneshotfl.api import resolve_config
from oneshotfl.runner.compare import result_differences
from oneshotfl.runner.config import parse_overrides
from oneshotfl.runner.report import splice_markdown

DEFAULT = {
    "dataset": "fashion_mnist",
    "max_train": 12000,
    "clients": 10,
    "partition": "dirichlet",
    "alpha": 0.3,
    "model": "cnn",
    "local_epochs": 2,
    "local_steps": 0,
    "methods": ["local", "fedavg", "ensemble", "fedov"],
    "cache_dir": None,
}
OUT = Path("benchmarks/results/workers")


def main(argv: list[str]) -> None:
    files = [a for a in argv if "=" not in a]
    config = files[0] if files else dict(DEFAULT)
    cfg = resolve_config(config, **parse_overrides([a for a in argv if "=" in a]))
    walls, docs = {}, {}
    for workers in (1, 2):
        start = time.perf_counter()
        docs[workers] = run_config(dataclasses.replace(cfg, workers=workers))
        walls[workers] = time.perf_counter() - start
    threads = torch.get_num_threads()
    start = time.perf_counter()
    run_config(dataclasses.replace(cfg, workers=1, client_threads=threads))
    before = time.perf_counter() - start
    differences = result_differences(docs[1], docs[2], ("1 worker", "2 workers"))
    speedup = walls[1] / walls[2]
    serial = max(0.0, min(1.0, 2 * walls[2] / walls[1] - 1))
    projected = {n: 1 / (serial + (1 - serial) / n) for n in (2, 4, 8, 16)}
    record = {
        "config": docs[1]["config"],
        "wall_s": {str(k): round(v, 2) for k, v in walls.items()},
        "wall_s_sequential_all_threads": round(before, 2),
        "threads": threads,
        "speedup_2_workers": round(speedup, 3),
        "serial_fraction": round(serial, 3),
        "projected_speedup": {str(n): round(s, 2) for n, s in projected.items()},
        "identical": not differences,
        "differences": differences[:10],
        "environment": docs[1]["environment"],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scaling.json").write_text(json.dumps(record, indent=2) + "\n")
    table = "\n".join(
        [
            "| workers | wall s | speedup | results |",
            "|---:|---:|---:|---|",
            f"| 1, client steps on {threads} threads (the runner before the pool) | "
            f"{before:.1f} | {walls[1] / before:.2f} | timed only |",
            f"| 1 | {walls[1]:.1f} | 1.00 | reference |",
            f"| 2 | {walls[2]:.1f} | {speedup:.2f} | "
            + ("identical" if not differences else f"{len(differences)} difference(s)")
            + " |",
            "",
            f"Serial fraction (Amdahl, from these two runs): f = {serial:.3f}; projected speedup "
            + ", ".join(f"{n} cores {s:.2f}×" for n, s in projected.items())
            + f" (CPU: {docs[1]['environment'].get('cpu')}).",
        ]
    )
    splice_markdown(Path("docs/benchmarks/speed.md"), "workers", table)
    print(table)
    if differences:
        raise SystemExit("bench_workers: the results differ between 1 and 2 workers")


if __name__ == "__main__":
    main(sys.argv[1:])
