#!/usr/bin/env bash
# Flower's simulation engine at 10, 100 and 1,000 virtual clients, and on a two-node Ray
# cluster, each against the local run measured back to back on this machine (issue 42).
#
#   scripts/bench_flower_scale.sh OUT_DIR "key=value ..." [N | one-worker:N | cluster:N ...]
#
# For each count N: scripts/flower_simulation.sh N (one CPU per virtual client; the peak
# memory of the SuperLink's process tree, Ray included), then `oneshotfl run` at one thread
# under scripts/tree_memory.py (the same sampler), then `oneshotfl compare` (must be equal).
# For each cluster:N: scripts/flower_ray_cluster.sh N (two Ray nodes on this host, one CPU
# each), compared with the local run of N made before in this script (or made now). For each
# one-worker:N: the simulation with 2 CPUs per virtual client (one Ray worker on two cores, so
# one more torch process instead of two). For each cohort:S:N: the simulation in cohorts of at
# most S clients (ceil(N / S) virtual SuperNodes, one message per node for its clients: run
# config cohort-size, src/oneshotfl/flower/cohort.py); cluster-cohort:S:N the same on the
# two-node Ray cluster. Writes
# simulation.jsonl, local.jsonl, cluster.jsonl and machine.json to OUT_DIR; results under
# runs/flower-scale-*. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR \"key=value ...\" [N ...] [cluster:N ...]" >&2; exit 2; }
OUT=$1
SETTINGS=$2
shift 2
COUNTS=(10 100 1000 one-worker:1000 cluster:100)
[ $# -ge 1 ] && COUNTS=("$@")
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
mkdir -p "$OUT"
rm -f "$OUT/simulation.jsonl" "$OUT/local.jsonl" "$OUT/cluster.jsonl"

local_run() {  # local_run N: the local run at one thread, measured like the Flower one
  local n=$1 dir=runs/flower-scale-local-$1
  [ -f "$dir/result.json" ] && grep -q "\"clients\": $n," "$OUT/local.jsonl" 2>/dev/null && return 0
  rm -rf "$dir"
  OMP_NUM_THREADS=1 "$BIN/python" scripts/tree_memory.py "$OUT/local-$n.json" -- \
    "$BIN/oneshotfl" run $SETTINGS "clients=$n" --out "$dir" >/dev/null
  "$BIN/python" - "$OUT/local-$n.json" "$n" "$dir" >>"$OUT/local.jsonl" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
doc = json.load(open(f"{sys.argv[3]}/result.json"))
print(json.dumps({
    "clients": int(sys.argv[2]), "wall_s": m["wall_s"], "peak_rss_mib": m["peak_rss_sum_mib"],
    "peak_pss_mib": m["peak_pss_sum_mib"],
    "upload_bytes": sum(sum(x["upload_bytes_per_client"]) for x in doc["methods"]),
    "accuracy": doc["methods"][0]["accuracy"], "results": sys.argv[3],
}))
PY
  rm -f "$OUT/local-$n.json"
}

for item in "${COUNTS[@]}"; do
  case "$item" in
    cluster:*)
      n=${item#cluster:}
      dir=$PWD/runs/flower-scale-cluster-$n
      rm -rf "$dir"
      bash scripts/flower_ray_cluster.sh "$n" "$SETTINGS" "$dir" >>"$OUT/cluster.jsonl"
      local_run "$n"
      "$BIN/oneshotfl" compare "runs/flower-scale-local-$n/result.json" "$dir/result.json"
      ;;
    cohort:*:*|cluster-cohort:*:*)
      rest=${item#*cohort:}
      size=${rest%%:*}
      n=${rest#*:}
      dir=$PWD/runs/flower-scale-${item%%:*}-$size-$n
      rm -rf "$dir"
      if [ "${item%%:*}" = cluster-cohort ]; then
        SIM_COHORT=$size bash scripts/flower_ray_cluster.sh "$n" "$SETTINGS" "$dir" >>"$OUT/cluster.jsonl"
      else
        SIM_COHORT=$size bash scripts/flower_simulation.sh "$n" "$SETTINGS" "$dir" >>"$OUT/simulation.jsonl"
      fi
      local_run "$n"
      "$BIN/oneshotfl" compare "runs/flower-scale-local-$n/result.json" "$dir/result.json"
      ;;
    one-worker:*)
      n=${item#one-worker:}
      dir=$PWD/runs/flower-scale-one-worker-$n
      rm -rf "$dir"
      SIM_CPUS_PER_CLIENT=2 bash scripts/flower_simulation.sh "$n" "$SETTINGS" "$dir" \
        | sed 's/^{/{"cpus_per_client": 2, /' >>"$OUT/simulation.jsonl"
      local_run "$n"
      "$BIN/oneshotfl" compare "runs/flower-scale-local-$n/result.json" "$dir/result.json"
      ;;
    *)
      n=$item
      dir=$PWD/runs/flower-scale-sim-$n
      rm -rf "$dir"
      bash scripts/flower_simulation.sh "$n" "$SETTINGS" "$dir" >>"$OUT/simulation.jsonl"
      local_run "$n"
      "$BIN/oneshotfl" compare "runs/flower-scale-local-$n/result.json" "$dir/result.json"
      ;;
  esac
done
"$BIN/python" - "$OUT/machine.json" "$SETTINGS" <<'PY'
import json, os, platform, sys
import flwr, ray, torch
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
json.dump({
    "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
    "python": platform.python_version(), "torch": torch.__version__,
    "flwr": flwr.__version__ if hasattr(flwr, "__version__") else "?", "ray": ray.__version__,
    "settings": sys.argv[2],
}, open(sys.argv[1], "w"), indent=2)
PY
echo "bench-flower-scale: results in $OUT"
