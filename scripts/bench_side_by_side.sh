#!/usr/bin/env bash
# A make target of two commits side by side (issue 27): each commit in a clean clone of this
# repository with its own venv (`make setup data` first, not timed); then, ROUNDS times in
# turn, the target in each clone from an empty cache (.cache, runs/ and the mypy cache
# removed), one after the other on an otherwise idle machine. Wall seconds, exit codes and
# the run's summary lines are appended to OUT (default
# benchmarks/results/speed/TARGET-runs.txt).
#
# With COMPARE=PATH (e.g. runs/demo), each round also compares the two clones' results at PATH
# (`oneshotfl compare`, the after clone's) and appends its verdict; with KEEP=DIR, each run's
# PATH/result.json is kept as DIR/REV-ROUND.json.
#
#   scripts/bench_side_by_side.sh TARGET BEFORE AFTER [ROUNDS]     e.g. test 7a16497 HEAD
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1 before=$(git rev-parse --short "$2") after=$(git rev-parse --short "$3") rounds=${4:-1}
OUT=${OUT:-$PWD/benchmarks/results/speed/$target-runs.txt}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-side-by-side.XXXXXX")
{
  echo "# make $target side by side, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# command: scripts/bench_side_by_side.sh $target $before $after $rounds"
} >>"$OUT"
for rev in "$before" "$after"; do
  git clone -q "$PWD" "$WORK/$rev"
  git -C "$WORK/$rev" checkout -q "$rev"
  (cd "$WORK/$rev" && make setup data >"$WORK/$rev-setup.log" 2>&1)
done
for round in $(seq "$rounds"); do
  for rev in "$before" "$after"; do
    log="$WORK/$rev-$target-$round.log"
    rm -rf "$WORK/$rev/.mypy_cache" "$WORK/$rev/.cache" "$WORK/$rev/runs"
    start=$(date +%s.%N)
    rc=0; (cd "$WORK/$rev" && make "$target" >"$log" 2>&1) || rc=$?
    wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
    {
      echo "$rev round $round: make $target rc=$rc wall=${wall}s"
      grep -E "^[0-9]+ passed|PASSED|FAILED|exit [0-9]|after set-up" "$log" | tail -n 4 | sed 's/^/  /'
    } >>"$OUT"
    if [ -n "${KEEP:-}" ] && [ -f "$WORK/$rev/${COMPARE:-runs/demo}/result.json" ]; then
      mkdir -p "$KEEP" && cp "$WORK/$rev/${COMPARE:-runs/demo}/result.json" "$KEEP/$rev-$round.json"
    fi
  done
  if [ -n "${COMPARE:-}" ]; then
    verdict=$("$WORK/$after/.venv/bin/oneshotfl" compare "$WORK/$before/$COMPARE" \
      "$WORK/$after/$COMPARE" 2>&1 | tail -n 1) || true
    echo "  round $round: $before against $after at $COMPARE: $verdict" >>"$OUT"
  fi
done
rm -rf "$WORK"
