#!/usr/bin/env bash
# What the demo's budgets buy (issue 50): configs/demo.yaml runs three methods below their
# defaults to finish sooner — centralized for 2 epochs (its default: the clients' 3), FedEOV
# with a one-step FGSM of 0.03 (default: three steps of 0.01, the same L-infinity reach) and
# IntactOFL with 2 synthesis rounds (the demo had 4). This runs the demo's federation with both
# budgets of each, and fedavg and the ensemble, on seeds 0-4 (a new federation per seed, the
# same one for every method of a seed), and writes each seed's result.json and the paired
# differences (cut minus full, mean and 95% t-interval over the seeds) to
# benchmarks/results/speed/demo-budgets/. About 12 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
OUT=${OUT:-benchmarks/results/speed/demo-budgets}
SEEDS=${SEEDS:-0,1,2,3,4}
if [ "${REPORT_ONLY:-0}" != 1 ]; then  # REPORT_ONLY=1: the paired differences of runs there
rm -rf "$OUT"
OMP_NUM_THREADS=1 "$BIN/oneshotfl" run --config configs/demo.yaml --out "$OUT" --seed "$SEEDS" \
  --methods "fedavg,ensemble,centralized,centralized:epochs=2,fedeov,fedeov:fgsm_steps=1:fgsm_step=0.03,intactofl:rounds=4:generator_steps=5,intactofl:rounds=2:generator_steps=5" \
  "encoder=" "cache_dir=.cache/demo-budgets" >"$OUT.log" 2>&1 || { tail -n 30 "$OUT.log"; exit 1; }
mv "$OUT.log" "$OUT/run.log"
fi
"$BIN/python" - "$OUT" <<'PY' | tee "$OUT/paired.txt"
import json
import pathlib
import sys

from scipy import stats

out = pathlib.Path(sys.argv[1])
runs = sorted(out.glob("seed=*/result.json"))
acc: dict[str, list[float]] = {}
own: dict[str, list[float]] = {}  # the method's own seconds: its clients' (summed) and server's
for path in runs:
    for m in json.loads(path.read_text())["methods"]:
        acc.setdefault(m["key"], []).append(100 * m["accuracy"])
        own.setdefault(m["key"], []).append(sum(m["client_own_s"]) + m["server_wall_s"])
n = len(runs)
print(f"# {n} seeds ({', '.join(p.parent.name for p in runs)}), accuracy in points; the method's")
print("# own seconds (its clients' summed, beyond the shared local models, and its server's)")
for key, values in acc.items():
    print(
        f"{key}: mean {sum(values) / n:.2f}  per seed {[round(v, 2) for v in values]}"
        f"  own s {sum(own[key]) / n:.1f}"
    )
print("# paired difference, cut budget minus full budget: mean [95% t-interval]")
for cut, full in [
    ("centralized:epochs=2", "centralized"),
    ("fedeov:fgsm_step=0.03:fgsm_steps=1", "fedeov"),
    ("intactofl:generator_steps=5:rounds=2", "intactofl:generator_steps=5:rounds=4"),
    ("fedeov:fgsm_step=0.03:fgsm_steps=1", "fedavg"),
    ("intactofl:generator_steps=5:rounds=2", "fedavg"),
]:
    d = [a - b for a, b in zip(acc[cut], acc[full], strict=True)]
    mean = sum(d) / n
    half = stats.t.ppf(0.975, n - 1) * stats.tstd(d) / n**0.5
    verdict = "no measurable difference" if mean - half <= 0 <= mean + half else (
        "higher" if mean - half > 0 else "lower")
    print(f"{cut} - {full}: {mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] ({verdict})")
PY
