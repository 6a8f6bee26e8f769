#!/usr/bin/env bash
# Mode 1: a oneshotfl experiment on Flower's simulation engine (Ray), one machine, N clients.
#
#   scripts/flower_simulation.sh N ["key=value ..." [OUT]]
#
# Starts a SuperLink in simulation mode on 127.0.0.1 (under a timeout, in its own process
# group, killed by PID at the end), submits the Flower app with options.num-supernodes=N,
# polls `flwr ls` until the run ends and requires finished:completed. Prints one JSON line:
# clients, status, wall seconds (submit → finished), Flower's elapsed and network traffic, and
# the peak memory of the SuperLink's process tree (Ray included: summed RSS and PSS, sampled each
# second, scripts/tree_memory.py), and the largest processes at the peak. The results directory is OUT (default runs/flower-sim-N-<timestamp>).
# Environment knobs: PYTHON_BIN (default .venv/bin), SIM_PORT (default 19280), SIM_TIMEOUT
# (seconds, default 3600), SIM_CPUS_PER_CLIENT (Ray CPUs per virtual node, default 1),
# SIM_RAY_ADDRESS (HOST:PORT of a running Ray cluster's head — `ray start --head` — to run the
# virtual clients on instead of a Ray instance of the SuperLink's own: Ray's own RAY_ADDRESS,
# set for the SuperLink; an address that does not answer stops the script before anything
# starts), SIM_MEMORY_ALSO (space-separated PIDs whose process trees count in the peak memory
# too, e.g. the cluster's `raylet` processes), SIM_COHORT (S > 0: cohorts of at most S clients,
# ceil(N / S) virtual SuperNodes each answering for its clients in one message, run config
# cohort-size; default 0, one client per SuperNode).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 N [\"key=value ...\" [OUT]]" >&2; exit 2; }
N=$1
OVERRIDES=${2:-}
OUT=$(realpath -m "${3:-runs/flower-sim-$N-$(date -u +%Y%m%d-%H%M%S)}")
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${SIM_PORT:-19280}
LIMIT=${SIM_TIMEOUT:-3600}
RAY_AT=${SIM_RAY_ADDRESS:-}
COHORT=${SIM_COHORT:-0}
[[ "$COHORT" =~ ^[0-9]+$ ]] || { echo "error: SIM_COHORT: expected an integer >= 0, got '$COHORT'" >&2; exit 2; }
NODES=$N
[ "$COHORT" -gt 0 ] && NODES=$(( (N + COHORT - 1) / COHORT ))
if [ -n "$RAY_AT" ]; then
  "$BIN/python" - "$RAY_AT" <<'PY' || exit 2
import socket, sys
address = sys.argv[1]
host, _, port = address.rpartition(":")
if not host or not port.isdigit():
    sys.exit(f"error: SIM_RAY_ADDRESS: expected HOST:PORT of a Ray head node, got {address!r}")
try:
    socket.create_connection((host, int(port)), 5).close()
except OSError as exc:
    sys.exit(f"error: the Ray cluster at {address} does not answer ({exc}); nothing started")
PY
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-flower-sim.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0
LINK_PID=""
SAMPLER_PID=""

cleanup() {
  local rc=$?
  [ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null || true
  if [ -n "$LINK_PID" ]; then
    kill -TERM -- "-$LINK_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$LINK_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$LINK_PID" 2>/dev/null || true
  fi
  [ "$rc" -ne 0 ] && tail -n 40 "$WORK/superlink.log" >&2
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "sim"

[superlink.sim]
address = "127.0.0.1:$PORT"
insecure = true
options.num-supernodes = $NODES
options.backend.client-resources.num-cpus = ${SIM_CPUS_PER_CLIENT:-1}
EOF
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null
[ -n "$RAY_AT" ] && export RAY_ADDRESS="$RAY_AT"
setsid timeout -k 5 "$LIMIT" flower-superlink --insecure --simulation \
  --disable-runtime-dependency-installation --host 127.0.0.1 --port "$PORT" \
  --database "$WORK/sim.db" >"$WORK/superlink.log" 2>&1 &
LINK_PID=$!

# Peak memory of the SuperLink's process tree (Ray included): summed RSS and PSS, and the
# largest processes at the peak (scripts/tree_memory.py), written to $WORK/memory.json.
also=()
for pid in ${SIM_MEMORY_ALSO:-}; do also+=(--also "$pid"); done
"$BIN/python" scripts/tree_memory.py "$WORK/memory.json" --pid "$LINK_PID" ${also[@]+"${also[@]}"} \
  --every 1 &
SAMPLER_PID=$!

for _ in $(seq 100); do
  "$BIN/python" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null && break
  sleep 0.3
done
start=$(date +%s.%N)
flwr run "$WORK/app" sim --format json \
  --run-config "overrides='clients=$N $OVERRIDES' out='$OUT' node-timeout=120.0 cohort-size=$COHORT" \
  >"$WORK/submit.json" 2>"$WORK/submit.log" || { cat "$WORK/submit.log" >&2; exit 1; }
run_id=$("$BIN/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['run-id'])" "$WORK/submit.json")
deadline=$((SECONDS + LIMIT))
while :; do
  timeout 60 flwr ls sim --run-id "$run_id" --format json >"$WORK/ls.json" 2>>"$WORK/submit.log"
  status=$("$BIN/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['status'])" "$WORK/ls.json")
  case "$status" in finished:*) break ;; esac
  [ "$SECONDS" -lt "$deadline" ] || { echo "run $run_id still '$status' after ${LIMIT}s" >&2; exit 1; }
  sleep 2
done
end=$(date +%s.%N)
"$BIN/python" - "$WORK/ls.json" "$N" "$start" "$end" "$WORK/memory.json" "$OUT" "$RAY_AT" "$COHORT" "$NODES" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
memory = json.load(open(sys.argv[5]))
try:
    placed = json.load(open(f"{sys.argv[6]}/result.json"))["flower"].get("placement", {})
except (OSError, KeyError, ValueError):
    placed = {}
print(json.dumps({
    "clients": int(sys.argv[2]),
    "cohort_size": int(sys.argv[8]),
    "supernodes": int(sys.argv[9]),
    "status": run["status"],
    "wall_s": round(float(sys.argv[4]) - float(sys.argv[3]), 1),
    "flower_elapsed_s": run["elapsed"],
    "network_traffic": run["network-traffic"],
    "peak_rss_mib": memory["peak_rss_sum_mib"],
    "peak_pss_mib": memory["peak_pss_sum_mib"],
    "processes": memory["processes_at_peak"],
    "largest": memory["largest_at_peak"],
    "results": sys.argv[6],
    "ray_address": sys.argv[7] or None,
    "clients_per_place": {place: len(ids) for place, ids in placed.items()},
}))
PY
[ "$status" = "finished:completed" ] || { echo "run $run_id ended '$status'" >&2; exit 1; }
