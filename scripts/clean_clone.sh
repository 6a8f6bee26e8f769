#!/usr/bin/env bash
# The README's two commands as a new user runs them (issue 34): a clean clone of HEAD, then
# `bash .ci/run` (CI's entry point: `make test`, set-up included) and `make demo` on an empty
# artefact cache, each timed; and the first run's one-off cost the demo's figure includes
# beside set-up: matplotlib's font cache, built in an empty config folder. Appends to OUT
# (default benchmarks/results/speed/clean-clone.txt). Run it on an otherwise idle machine.
#
#   scripts/clean_clone.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/benchmarks/results/speed/clean-clone.txt}
rev=$(git rev-parse --short HEAD)
work=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-clean-clone.XXXXXX")
# The clone with its .venv is ~7 GiB: removed however the script ends (clones left in /tmp
# filled this machine's disk and failed a later CI run's pip install); the logs stay in $work.
trap 'rm -rf "$work/repo" "$work/mplconfig"; echo "clean_clone: logs in $work"' EXIT
git clone -q "$PWD" "$work/repo"
cd "$work/repo"
cpu() {  # the CPU's name, family and model (the README's times are quoted per machine)
  field() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2 | xargs; }
  echo "$(field 'model name') (family $(field 'cpu family') model $(field model))"
}
timed() {  # NAME COMMAND...: run, then "NAME rc=RC wall=Ss"
  local name=$1 start rc=0
  shift
  start=$(date +%s.%N)
  "$@" >"$work/$name.log" 2>&1 || rc=$?
  echo "$name rc=$rc wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.0f}')")s"
}
{
  echo
  echo "# Fresh clone at $rev, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(cpu), idle (scripts/clean_clone.sh)"
  timed ci env CI=true bash .ci/run </dev/null
  grep -E "^bootstrap: installed|^[0-9]+ passed|exit [0-9]|^seconds: " "$work/ci.log" | tail -n 4
  rm -rf .cache runs/demo
  timed demo make demo
  grep "after set-up" "$work/demo.log"
  fonts="$work/mplconfig"; rm -rf "$fonts"; mkdir "$fonts"
  for round in first again; do
    start=$(date +%s.%N)
    MPLCONFIGDIR=$fonts .venv/bin/python -c "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as p; p.figure(); p.text(0, 0, 'x'); p.savefig('$fonts/a.png')"
    echo "matplotlib, $round import and plot in an empty config folder: $(python3 -c "print(f'{$(date +%s.%N) - $start:.2f}')") s"
  done
} | tee -a "$OUT"
# The README quotes the latest clean clones of its machine (tests/test_readme_times.py): a new
# entry fails the suite until the README's sentence names it.
echo "clean_clone: update README.md's clean-clone sentence to $rev, then run tests/test_readme_times.py" >&2
