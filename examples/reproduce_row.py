"""Reproduce a committed result from Python and check that it is identical.

By default the run is ``examples/digits-row.yaml`` — the core table's methods (local, fedavg,
the two ensembles, centralized) on scikit-learn's digits, 5 clients, Dirichlet α=0.5 — whose
committed result is ``examples/digits-row/result.json``; it takes a few seconds on one core.
Any committed ``result.json`` can be given instead (a Fashion-MNIST run of
``benchmarks/results/`` takes minutes and needs the dataset)::

    OMP_NUM_THREADS=1 python examples/reproduce_row.py
    python examples/reproduce_row.py benchmarks/results/core-fmnist/<run>/result.json
    OMP_NUM_THREADS=1 python examples/reproduce_row.py --record   # re-record the digits run

A run is deterministic at a fixed thread count on one machine, so the script runs on the
committed run's device with its thread count, with the artefact cache off (every model is
trained again), and compares what two runs of one experiment must share — every method's
accuracies, bytes and clients — as ``oneshotfl compare`` does. Exit status: 0 when the
result is reproduced exactly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import oneshotfl

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "digits-row.yaml"
COMMITTED = HERE / "digits-row" / "result.json"


def record() -> int:
    """Run ``digits-row.yaml`` single-threaded and commit its result as the reference."""
    torch.set_num_threads(1)
    result = oneshotfl.run(CONFIG)
    COMMITTED.parent.mkdir(parents=True, exist_ok=True)
    COMMITTED.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    print(f"recorded {COMMITTED} ({result.wall_time_s:.1f} s)")
    return 0


def reproduce(path: Path) -> int:
    """Run the committed result's config again; print both as a table; 0 when identical."""
    committed = oneshotfl.Result.load(path)
    torch.set_num_threads(int(committed.environment.get("threads", 1)))
    device = str(committed.environment.get("device", committed.config.device))
    start = time.perf_counter()
    again = oneshotfl.run(committed.config, cache_dir=None, device=device)
    elapsed = time.perf_counter() - start
    print(f"{committed.config.dataset}, seed {committed.config.seed}: test accuracy (%)")
    print("| method | committed | reproduced | upload / client (bytes) |")
    print("|---|---:|---:|---:|")
    for old in committed.methods:
        new = again.method(old.key)
        print(
            f"| {old.key} | {100 * old.accuracy:.2f} | {100 * new.accuracy:.2f} "
            f"| {new.upload_bytes_mean:.0f} |"
        )
    diffs = committed.differences(again, labels=("committed", "reproduced"))
    for line in diffs:
        print(f"differs: {line}", file=sys.stderr)
    verdict = "identical" if not diffs else f"{len(diffs)} difference(s)"
    print(f"{verdict} to {path} ({elapsed:.1f} s, {torch.get_num_threads()} thread(s))")
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("result", nargs="?", type=Path, default=COMMITTED, help="a result.json")
    parser.add_argument("--record", action="store_true", help="re-record the digits result")
    args = parser.parse_args(argv)
    return record() if args.record else reproduce(args.result)


if __name__ == "__main__":
    sys.exit(main())
