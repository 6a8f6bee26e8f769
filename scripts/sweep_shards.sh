#!/usr/bin/env bash
# Runs each named benchmark (benchmarks/NAME.yaml) as two single-threaded processes, one per
# core, that claim its grid points as they go (`--shard K/2 --claim`: balanced when points
# differ in cost; runs are deterministic at a fixed thread count), then splices its report into
# the page of docs/benchmarks/ that holds the markers <!-- report:NAME --> (one page must).
# Stops at the first shard or report that fails.
# Usage: scripts/sweep_shards.sh NAME [NAME ...]   (VENV: the virtualenv's bin, default .venv/bin;
# REPORT=0: the sweeps alone, for a benchmark with a report script of its own; SEEDS=3,4: only
# these seeds, e.g. a sweep's claim_seeds beside full seeds recorded with an older config)
set -euo pipefail
venv=${VENV:-.venv/bin}
report=${REPORT:-1}
for name in "$@"; do
  sweep=("$venv/oneshotfl" sweep "benchmarks/$name.yaml" --out "benchmarks/results/$name"
    ${SEEDS:+--seeds "$SEEDS"})
  OMP_NUM_THREADS=1 "${sweep[@]}" --shard 0/2 --claim &
  first=$!
  rc=0
  OMP_NUM_THREADS=1 "${sweep[@]}" --shard 1/2 --claim || rc=$?
  wait "$first" || rc=$?  # both shards finish before a failure stops the script
  [ "$rc" -eq 0 ] || exit "$rc"
  [ "$report" = 0 ] && continue
  pages=$(grep -l -- "<!-- report:$name -->" docs/benchmarks/*.md || true)
  if [ "$(printf '%s' "$pages" | grep -c .)" -ne 1 ]; then
    echo "sweep_shards.sh: expected one page of docs/benchmarks/ with <!-- report:$name -->," \
      "found: ${pages:-none}" >&2
    exit 1
  fi
  "$venv/oneshotfl" report "benchmarks/results/$name" --out "docs/figures/$name" \
    --markdown "$pages" --section "$name"
done
# the summaries the benchmark pages open with read these results too (tests/test_docs.py)
[ "$report" = 0 ] || "$venv/python" scripts/page_summaries.py
