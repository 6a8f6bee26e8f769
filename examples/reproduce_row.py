"""Reproduce a committed result from Python: exactly where the same kernels ran it, else
itself exactly and the committed numbers within a stated tolerance.

By default the run is ``examples/digits-row.yaml`` — the core table's methods (local, fedavg,
the two ensembles, centralized) on scikit-learn's digits, 5 clients, Dirichlet α=0.5 — whose
committed result is ``examples/digits-row/result.json``; it takes a few seconds on one core.
Any committed ``result.json`` can be given instead (a Fashion-MNIST run of
``benchmarks/results/`` takes minutes and needs the dataset)::

    OMP_NUM_THREADS=1 python examples/reproduce_row.py
    python examples/reproduce_row.py benchmarks/results/core-fmnist/<run>/result.json
    OMP_NUM_THREADS=1 python examples/reproduce_row.py --record   # re-record the digits run

The script runs on the committed run's device with its thread count, with the artefact cache
off (every model is trained again). A run is bit-identical only where the same float kernels
ran it (:func:`oneshotfl.environment.kernel_differences`: CPU, instruction set, torch build,
threads, device). So:

* **same kernels** — what two runs of one experiment must share (every method's accuracies,
  bytes and clients, as ``oneshotfl compare`` checks) must equal the committed result;
* **other kernels** (another CPU, say) — the last bits of a float kernel differ, and a
  training run amplifies them into a different trajectory, as a new model seed would. The
  script then runs twice: the two runs must be identical (determinism on this machine), bytes,
  clients and data must equal the committed ones, and each method's test and personal
  accuracy must lie within its tolerance of the committed value. The tolerance is
  ``4·√2·σ`` — σ the method's standard deviation over model seeds, recorded beside the
  result as ``spread.json`` (``--record`` writes it; √2 since both sides are draws, 4 so
  that the ten checks of the digits run all pass on another CPU about 999 times in 1 000) —
  and at least two test examples; ``--tolerance POINTS`` sets one for
  every method (needed for a result recorded without a spread).

Exit status: 0 when reproduced, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

import oneshotfl
from oneshotfl.environment import kernel_differences, kernel_signature
from oneshotfl.runner.compare import result_differences

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "digits-row.yaml"
COMMITTED = HERE / "digits-row" / "result.json"
SPREAD_SEEDS = range(1, 9)
"""The model seeds ``--record`` measures each method's spread over (the partition fixed)."""


def record() -> int:
    """Run ``digits-row.yaml`` single-threaded and commit its result as the reference, and
    the spread of every method's accuracy over :data:`SPREAD_SEEDS` as ``spread.json``."""
    torch.set_num_threads(1)
    result = oneshotfl.run(CONFIG)
    COMMITTED.parent.mkdir(parents=True, exist_ok=True)
    COMMITTED.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    print(f"recorded {COMMITTED} ({result.wall_time_s:.1f} s)")
    cfg = dataclasses.replace(result.config, partition_seed=result.config.data_seed)
    runs = [oneshotfl.run(dataclasses.replace(cfg, seed=s)) for s in SPREAD_SEEDS]
    spread = {
        "seeds": list(SPREAD_SEEDS),
        "partition_seed": cfg.data_seed,
        "environment": kernel_signature(),
        "std": {
            field: {
                key: statistics.stdev(getattr(r.method(key), field) for r in runs)
                for key in result.keys
            }
            for field in ("accuracy", "personal_accuracy")
        },
    }
    path = COMMITTED.with_name("spread.json")
    path.write_text(json.dumps(spread, indent=2) + "\n")
    print(f"recorded {path} (model seeds {SPREAD_SEEDS.start}-{SPREAD_SEEDS.stop - 1})")
    return 0


def tolerances(path: Path, test_size: int, points: float | None) -> dict[str, dict[str, float]]:
    """Per accuracy field and method key, how far a run on other kernels may land from the
    committed one (see the module docs); ``points`` overrides every method's."""
    floor = 2 / test_size
    spread_file = path.with_name("spread.json")
    if points is not None or not spread_file.exists():
        if points is None:
            raise SystemExit(
                f"{path} was recorded on other kernels and has no spread.json beside it: "
                "expected --tolerance POINTS"
            )
        return {f: {"*": max(points / 100, floor)} for f in ("accuracy", "personal_accuracy")}
    std: dict[str, dict[str, float]] = json.loads(spread_file.read_text())["std"]
    return {f: {k: max(4 * math.sqrt(2) * s, floor) for k, s in v.items()} for f, v in std.items()}


def within(
    committed: oneshotfl.Result, again: oneshotfl.Result, tol: dict[str, dict[str, float]]
) -> list[str]:
    """Each method's accuracies farther from the committed ones than its tolerance."""
    out = []
    for old in committed.methods:
        new = again.method(old.key)
        for field, by_key in tol.items():
            a, b = getattr(old, field), getattr(new, field)
            limit = by_key.get(old.key, by_key.get("*", 0.0))
            if a is not None and b is not None and abs(a - b) > limit:
                out.append(
                    f"{old.key}.{field}: {100 * a:.2f} committed, {100 * b:.2f} here "
                    f"(tolerance ±{100 * limit:.2f} points)"
                )
    return out


KERNEL_FREE = ("key", "upload_bytes_per_client", "download_bytes_per_client", "clients_used")
"""Method fields no float kernel can change."""


def shared(committed: oneshotfl.Result, again: oneshotfl.Result) -> list[str]:
    """What no float kernel can change: the data, every method's bytes and clients, and the
    clients' data facts (``oneshotfl compare``'s check, on those fields alone)."""
    a, b = committed.to_dict(), again.to_dict()
    for doc in (a, b):
        doc["methods"] = [{k: m[k] for k in KERNEL_FREE if k in m} for m in doc["methods"]]
    both = a["data"].keys() & b["data"].keys()  # a fact one version records (class names) is new
    facts = [{k: doc["data"][k] for k in sorted(both)} for doc in (a, b)]
    diffs = [f"data: {facts[0]} committed, {facts[1]} here"] if facts[0] != facts[1] else []
    return diffs + result_differences(a, b, ("committed", "here"))


def reproduce(path: Path, points: float | None = None) -> int:
    """Run the committed result's config again; print both as a table; 0 when reproduced."""
    committed = oneshotfl.Result.load(path)
    torch.set_num_threads(int(committed.environment.get("threads", 1)))
    device = str(committed.environment.get("device", committed.config.device))
    others = kernel_differences(committed.environment, kernel_signature(device))
    # known before any run, so that a result without them is refused untrained
    tol = tolerances(path, committed.data["test_size"], points) if others else {}
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
    threads = f"{torch.get_num_threads()} thread(s)"
    if not others:
        diffs = committed.differences(again, labels=("committed", "reproduced"))
        verdict = "identical" if not diffs else f"{len(diffs)} difference(s)"
        print(f"{verdict} to {path} ({elapsed:.1f} s, {threads}; same kernels as recorded)")
    else:
        print(f"recorded on other kernels ({'; '.join(others)}): checking within tolerance")
        twice = oneshotfl.run(committed.config, cache_dir=None, device=device)
        diffs = [f"not deterministic here: {d}" for d in again.differences(twice)]
        diffs += shared(committed, again)
        diffs += within(committed, again, tol)
        verdict = "reproduced" if not diffs else f"{len(diffs)} difference(s)"
        print(
            f"{verdict}: identical to itself, within tolerance of {path} "
            f"({elapsed:.1f} s a run, {threads})"
            if not diffs
            else f"{verdict} to {path} ({elapsed:.1f} s a run, {threads})"
        )
    for line in diffs:
        print(f"differs: {line}", file=sys.stderr)
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("result", nargs="?", type=Path, default=COMMITTED, help="a result.json")
    parser.add_argument("--record", action="store_true", help="re-record the digits result")
    parser.add_argument(
        "--tolerance", type=float, default=None, help="points, on other kernels (default: spread)"
    )
    args = parser.parse_args(argv)
    return record() if args.record else reproduce(args.result, args.tolerance)


if __name__ == "__main__":
    sys.exit(main())
