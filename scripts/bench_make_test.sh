#!/usr/bin/env bash
# `make test` of two commits side by side (issue 27): each in a clean clone of this repository
# with its own venv (set up first, not timed), from an empty mypy cache, one after the other
# on an otherwise idle machine, ROUNDS times in turn. Wall seconds, exit codes and each run's
# summary lines are appended to OUT (default benchmarks/results/speed/make-test-runs.txt).
#
#   scripts/bench_make_test.sh BEFORE AFTER [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1 after=$2 rounds=${3:-1}
OUT=${OUT:-$PWD/benchmarks/results/speed/make-test-runs.txt}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-make-test.XXXXXX")
{
  echo "# make test side by side, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# command: scripts/bench_make_test.sh $before $after $rounds"
} >>"$OUT"
for rev in "$before" "$after"; do
  git clone -q "$PWD" "$WORK/$rev"
  git -C "$WORK/$rev" checkout -q "$rev"
  (cd "$WORK/$rev" && make setup data >"$WORK/$rev-setup.log" 2>&1)
done
for round in $(seq "$rounds"); do
  for rev in "$before" "$after"; do
    log="$WORK/$rev-test-$round.log"
    rm -rf "$WORK/$rev/.mypy_cache" "$WORK/$rev/runs"
    start=$(date +%s.%N)
    rc=0; (cd "$WORK/$rev" && make test >"$log" 2>&1) || rc=$?
    wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
    {
      echo "$rev round $round: make test rc=$rc wall=${wall}s"
      grep -E "^[0-9]+ passed|PASSED|FAILED|exit [0-9]" "$log" | tail -n 4 | sed 's/^/  /'
    } >>"$OUT"
  done
done
rm -rf "$WORK"
