#!/usr/bin/env bash
# What FedEOV's client epochs buy in the demo (issue 50): its clients are most of the demo's
# time (a negatives curriculum over the run's 3 local epochs). This runs the demo's federation
# (configs/demo.yaml) on seeds 0-4 with fedavg, the ensemble and FedEOV's demo reading at 3
# and at 2 epochs, and writes each seed's result.json and the paired differences (mean and 95%
# t-interval over the seeds, scripts/paired.py) to benchmarks/results/speed/demo-fedeov-epochs/.
# About 8 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
OUT=${OUT:-benchmarks/results/speed/demo-fedeov-epochs}
EOV="fedeov:fgsm_steps=1:fgsm_step=0.03"
rm -rf "$OUT"
OMP_NUM_THREADS=1 "$BIN/oneshotfl" run --config configs/demo.yaml --out "$OUT" --seed 0,1,2,3,4 \
  --methods "fedavg,ensemble,$EOV,$EOV:epochs=2" "encoder=" "cache_dir=.cache/demo-budgets" \
  >"$OUT.log" 2>&1 || { tail -n 30 "$OUT.log"; exit 1; }
mv "$OUT.log" "$OUT/run.log"
"$BIN/python" scripts/paired.py methods "$OUT" \
  "fedeov:epochs=2:fgsm_step=0.03:fgsm_steps=1 - fedeov:fgsm_step=0.03:fgsm_steps=1" \
  "fedeov:epochs=2:fgsm_step=0.03:fgsm_steps=1 - fedavg" \
  "fedeov:epochs=2:fgsm_step=0.03:fgsm_steps=1 - ensemble" \
  "fedeov:fgsm_step=0.03:fgsm_steps=1 - ensemble" | tee "$OUT/paired.md"
