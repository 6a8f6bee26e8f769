"""Peak memory of one run: ``oneshotfl run --config CONFIG`` as a child process, then its
peak resident set size (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the largest child's peak, so
the config should run in one process, ``workers: 1``) and wall time, written to
``benchmarks/results/<config stem>/peak.json`` and printed.

Usage: ``python scripts/peak_memory.py CONFIG.yaml`` (run on an otherwise idle machine).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFERENCE_GIB = 1.46
"""The FedEOV reference code's peak on the target run (issue 27)."""


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: peak_memory.py CONFIG.yaml")
    config = Path(argv[0])
    exe = Path(sys.executable).with_name("oneshotfl")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(
            [str(exe), "run", "--config", str(config), "--out", out], check=True, env=env
        )
        wall = time.perf_counter() - start
        accuracy = {m["key"]: m["accuracy"] for m in json.loads(
            (Path(out) / "result.json").read_text())["methods"]}  # fmt: skip
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux
    record = {
        "config": str(config),
        "peak_rss_gib": round(peak_gib, 3),
        "reference_gib": REFERENCE_GIB,
        "ratio_to_reference": round(peak_gib / REFERENCE_GIB, 3),
        "wall_s": round(wall, 1),
        "omp_num_threads": env["OMP_NUM_THREADS"],
        "accuracy": accuracy,
    }
    target = Path("benchmarks/results") / config.stem / "peak.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
