#!/usr/bin/env bash
# Flower's simulation engine on an existing Ray cluster of two nodes, both on this host.
#
#   scripts/flower_ray_cluster.sh N ["key=value ..." [OUT]]
#
# Starts a Ray head node (`ray start --head --num-cpus 1`) and a second node that joins it
# (`ray start --address HEAD --num-cpus 1`), each with its own temp dir and ports, exactly as
# on two machines; runs scripts/flower_simulation.sh N with SIM_RAY_ADDRESS=HEAD (the
# SuperLink's simulation engine connects to the cluster instead of starting a Ray of its own)
# and the two nodes' process trees counted in its peak memory; requires the result to say
# that clients ran on both Ray nodes (result.json: flower.placement); then stops both nodes.
# Prints the simulation's JSON line with "ray_nodes": 2. With LACKING=1 the second node is
# started without the data (ONESHOTFL_DATA pointing at an empty folder, the dataset `mnist`
# written only for the head node and the ServerApp): the run must complete with the head
# node's clients and name each client the second node could not serve, without waiting on a
# clock. Environment knobs: PYTHON_BIN (default .venv/bin), RAY_PORT (head's port, default
# 6390; the nodes use the 100 ports above it), KEEP=1 keeps the work directory.
#
# On real hosts: the same `ray start` commands on each machine (the same Python environment
# and oneshotfl, the data at the same path or under ONESHOTFL_DATA there), then
# SIM_RAY_ADDRESS=HEAD:PORT scripts/flower_simulation.sh N on the head (docs/deploy.md,
# "Running across machines").
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 N [\"key=value ...\" [OUT]]" >&2; exit 2; }
N=$1
OVERRIDES=${2:-}
OUT=$(realpath -m "${3:-runs/flower-ray-$N-$(date -u +%Y%m%d-%H%M%S)}")
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${RAY_PORT:-6390}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-ray.XXXXXX")
export PATH="$BIN:$PATH" RAY_USAGE_STATS_ENABLED=0
HEAD="127.0.0.1:$PORT"

stop_cluster() {
  # each node stopped through its own temp dir's session: other Ray instances are untouched
  local dir pid
  for dir in "$WORK/ray-b" "$WORK/ray-a"; do
    for pid in $(pgrep -f -- "$dir" || true); do kill -TERM "$pid" 2>/dev/null || true; done
  done
  sleep 2
  for dir in "$WORK/ray-b" "$WORK/ray-a"; do
    for pid in $(pgrep -f -- "$dir" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  done
}

cleanup() {
  local rc=$?
  stop_cluster
  [ "$rc" -ne 0 ] && for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

# ray_node DIR BASE ARGS...: `ray start` with its own temp dir and ports from BASE (two nodes
# share a host)
ray_node() {
  local dir=$1 base=$2
  shift 2
  ray start --num-cpus 1 --temp-dir "$dir" --node-ip-address 127.0.0.1 --disable-usage-stats \
    --node-manager-port $((base + 1)) --object-manager-port $((base + 2)) \
    --runtime-env-agent-port $((base + 3)) --dashboard-agent-grpc-port $((base + 4)) \
    --dashboard-agent-listen-port $((base + 5)) --metrics-export-port $((base + 6)) \
    --min-worker-port $((base + 10)) --max-worker-port $((base + 49)) "$@"
}

DATA_ENV=()
if [ "${LACKING:-0}" = 1 ]; then
  # `mnist` only where the head node and the ServerApp look; the second node sees an empty folder
  "$BIN/python" - "$WORK/data/mnist" <<'PY'
import gzip, sys
from pathlib import Path
import numpy as np
folder = Path(sys.argv[1]); folder.mkdir(parents=True)
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (600, 28, 28), dtype=np.uint8); y = (np.arange(600) % 10).astype(np.uint8)
for stem, a in (("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y),
                ("t10k-images-idx3-ubyte", x[:100]), ("t10k-labels-idx1-ubyte", y[:100])):
    header = bytes([0, 0, 8, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    (folder / f"{stem}.gz").write_bytes(gzip.compress(header + a.tobytes()))
PY
  mkdir -p "$WORK/empty"
  DATA_ENV=(ONESHOTFL_DATA="$WORK/data")
fi

(
  export ONESHOTFL_SHARED_DATA="$WORK/shared-a" ${DATA_ENV[@]+"${DATA_ENV[@]}"}
  ray_node "$WORK/ray-a" $((PORT + 10)) --head --port "$PORT" --include-dashboard false
) >"$WORK/ray-a.log" 2>&1 || { cat "$WORK/ray-a.log" >&2; exit 1; }
(
  export ONESHOTFL_SHARED_DATA="$WORK/shared-b"
  [ "${LACKING:-0}" = 1 ] && export ONESHOTFL_DATA="$WORK/empty"
  ray_node "$WORK/ray-b" $((PORT + 60)) --address "$HEAD"
) >"$WORK/ray-b.log" 2>&1 || { cat "$WORK/ray-b.log" >&2; exit 1; }
"$BIN/python" - "$HEAD" <<'PY'
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR")
for _ in range(60):
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) == 2:
        break
    time.sleep(1)
cpus = ray.cluster_resources().get("CPU", 0)
print(f"ray cluster: {len(alive)} nodes, {cpus:g} CPUs", file=sys.stderr)
sys.exit(0 if len(alive) == 2 and cpus == 2 else 1)
PY

raylets=$(pgrep -f -- "$WORK/ray-" | tr "\n" " ")
env ${DATA_ENV[@]+"${DATA_ENV[@]}"} SIM_RAY_ADDRESS="$HEAD" SIM_MEMORY_ALSO="$raylets" \
  bash scripts/flower_simulation.sh "$N" "$OVERRIDES" "$OUT" >"$WORK/sim.json" || {
  # a run that ended failed still wrote its result: show what it says, then fail
  cat "$WORK/sim.json" >&2
  exit 1
}
"$BIN/python" - "$WORK/sim.json" "$OUT/result.json" "${LACKING:-0}" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).read())
doc = json.load(open(sys.argv[2]))
places = doc["flower"]["placement"]
workers = {p.split("/", 1)[1] for p in places if "/" in p}
method = doc["methods"][0]
if sys.argv[3] == "1":
    missing = method.get("no_reply", {})
    if len(workers) != 1 or not missing:
        sys.exit(f"expected the clients of one Ray node and the others named, got {places} / {missing}")
    print(f"lacking data: {len(method['clients_used'])} clients aggregated, {len(missing)} named, "
          f"e.g. {next(iter(missing.items()))}", file=sys.stderr)
elif len(workers) != 2:
    sys.exit(f"expected clients on both Ray nodes, got {sorted(places)}")
line["ray_nodes"] = len(workers)
print(json.dumps(line))
PY
