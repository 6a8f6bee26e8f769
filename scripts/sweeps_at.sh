#!/usr/bin/env bash
# Runs committed benchmark sweeps with the code of one git revision, for before/after checks.
#
#   scripts/sweeps_at.sh REF OUT SWEEP[@SEEDS] ...     e.g. HEAD~3 /tmp/before core-fmnist fedol-fmnist@0
#
# REF is checked out as a detached worktree in OUT/tree (reused if it is exactly REF), so the
# run has its own artefact cache (OUT/tree/.cache) and never reads another revision's client
# models. Every sweep runs as two OMP_NUM_THREADS=1 shards, one per core; each shard works
# through the sweeps in order. Results land in OUT/<sweep>/, logs in OUT/<sweep>.shardK.log. Compare two
# such folders with `oneshotfl compare BEFORE/SWEEP AFTER/SWEEP`.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 REF OUT SWEEP[@SEEDS] ..." >&2; exit 2; }
ref=$1 out=$2
shift 2
root=$(git rev-parse --show-toplevel)
py=$root/.venv/bin/python
mkdir -p "$out"
out=$(cd "$out" && pwd)
tree=$out/tree
want=$(git -C "$root" rev-parse "$ref^{commit}")
if [ ! -d "$tree" ]; then
  git -C "$root" worktree add --detach "$tree" "$want" >/dev/null
fi
have=$(git -C "$tree" rev-parse HEAD)
if [ "$have" != "$want" ] || [ -n "$(git -C "$tree" status --porcelain)" ]; then
  echo "sweeps_at: $tree holds $have (or local edits), not $ref = $want; remove it or pick another OUT" >&2
  exit 2
fi
echo "sweeps_at: $(git -C "$tree" rev-parse HEAD) in $tree" | tee "$out/revision.txt"
shard() {
  local k=$1 item name seeds
  shift
  for item in "$@"; do
    name=${item%@*}
    seeds=()
    if [[ $item == *@* ]]; then seeds=(--seeds "${item#*@}"); fi
    (cd "$tree" && OMP_NUM_THREADS=1 PYTHONPATH="$tree/src" "$py" -m oneshotfl sweep \
      "benchmarks/$name.yaml" --out "$out/$name" --shard "$k/2" "${seeds[@]}") \
      >"$out/$name.shard$k.log" 2>&1 || { echo "sweeps_at: $name shard $k failed" >&2; return 1; }
  done
}
shard 0 "$@" &
first=$!
shard 1 "$@"
wait "$first"
echo "sweeps_at: done → $out"
