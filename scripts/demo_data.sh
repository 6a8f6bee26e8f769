#!/usr/bin/env bash
# What the demo's data size buys (issue 50): configs/demo.yaml's federation at MAX_TRAIN training
# images (default 16000) on seeds 0-4, every method of the demo as configured (a new federation
# per seed, the same one for every method of a seed). Writes each seed's result.json and the
# paired differences (each seed system minus one-shot FedAvg, and FOL's personal accuracy minus
# the ensemble's; mean and 95% t-interval over the seeds) to
# benchmarks/results/speed/demo-data/max_train=N/. It measures what the demo shows, not its
# time: the demo's time is a clean clone's (scripts/clean_clone.sh). About 8 minutes on 2 cores
# at 16000.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
MAX_TRAIN=${MAX_TRAIN:-16000}
OUT=${OUT:-benchmarks/results/speed/demo-data/max_train=$MAX_TRAIN}
SEEDS=${SEEDS:-0 1 2 3 4}
if [ "${REPORT_ONLY:-0}" != 1 ]; then  # REPORT_ONLY=1: the paired differences of runs there
  rm -rf "$OUT" && mkdir -p "$OUT"
  for s in $SEEDS; do
    "$BIN/oneshotfl" run --config configs/demo.yaml --out "$OUT/seed=$s" --no-cache \
      "max_train=$MAX_TRAIN" "seed=$s" >"$OUT/seed=$s.log" 2>&1 || { tail -n 30 "$OUT/seed=$s.log"; exit 1; }
    mv "$OUT/seed=$s.log" "$OUT/seed=$s/run.log"
  done
fi
"$BIN/python" - "$OUT" <<'PY' | tee "$OUT/paired.txt"
import json
import pathlib
import platform
import sys

import torch
from scipy import stats

out = pathlib.Path(sys.argv[1])
runs = sorted(out.glob("seed=*/result.json"))
acc: dict[str, list[float]] = {}
personal: dict[str, list[float]] = {}
for path in runs:
    for m in json.loads(path.read_text())["methods"]:
        acc.setdefault(m["key"], []).append(100 * m["accuracy"])
        personal.setdefault(m["key"], []).append(100 * m["personal_accuracy"])
n = len(runs)
env = json.loads(runs[0].read_text())["environment"]
print(f"# {n} seeds ({', '.join(p.parent.name for p in runs)}) of configs/demo.yaml at")
print(f"# {out.name}; accuracy in points; on {env.get('cpu_id', platform.processor())},")
print(f"# torch {torch.__version__}")
for key, values in acc.items():
    print(f"{key}: mean {sum(values) / n:.2f}  per seed {[round(v, 2) for v in values]}"
          f"  personal {sum(personal[key]) / n:.2f}")


def interval(d: list[float]) -> str:
    mean = sum(d) / n
    half = stats.t.ppf(0.975, n - 1) * stats.tstd(d) / n**0.5
    verdict = "no measurable difference" if mean - half <= 0 <= mean + half else (
        "higher" if mean - half > 0 else "lower")
    return f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] ({verdict})"


print("# paired difference, method minus one-shot FedAvg: mean [95% t-interval]")
for key in acc:
    if key.split(":")[0] in ("fedol", "fedage", "fedeov", "intactofl"):
        print(f"{key} - fedavg: {interval([a - b for a, b in zip(acc[key], acc['fedavg'])])}")
fol = next(k for k in acc if k.startswith("fol"))
print("# FOL keeps a model per client: its personal accuracy minus the ensemble's")
print(f"{fol} personal - ensemble personal: "
      f"{interval([a - b for a, b in zip(personal[fol], personal['ensemble'])])}")
PY
