#!/usr/bin/env bash
# Runs each named benchmark (benchmarks/NAME.yaml) as two single-threaded processes, one per
# core, that claim its grid points as they go (`--shard K/2 --claim`: balanced when points
# differ in cost; runs are deterministic at a fixed thread count), then splices its report into
# docs/benchmarks.md under the section NAME. Stops at the first shard or report that fails.
# Usage: scripts/sweep_shards.sh NAME [NAME ...]   (VENV: the virtualenv's bin, default .venv/bin;
# REPORT=0: the sweeps alone, for a benchmark with a report script of its own)
set -euo pipefail
venv=${VENV:-.venv/bin}
report=${REPORT:-1}
for name in "$@"; do
  sweep=("$venv/oneshotfl" sweep "benchmarks/$name.yaml" --out "benchmarks/results/$name")
  OMP_NUM_THREADS=1 "${sweep[@]}" --shard 0/2 --claim &
  first=$!
  rc=0
  OMP_NUM_THREADS=1 "${sweep[@]}" --shard 1/2 --claim || rc=$?
  wait "$first" || rc=$?  # both shards finish before a failure stops the script
  [ "$rc" -eq 0 ] || exit "$rc"
  [ "$report" = 0 ] && continue
  "$venv/oneshotfl" report "benchmarks/results/$name" --out "docs/figures/$name" \
    --markdown docs/benchmarks.md --section "$name"
done
