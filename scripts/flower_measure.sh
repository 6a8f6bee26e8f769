#!/usr/bin/env bash
# Bytes on the wire and wall-time overhead of Flower deployment vs the local simulation.
#
#   scripts/flower_measure.sh "key=value ..." METHOD [METHOD ...]
#
# Starts one insecure SuperLink and `clients` (default 3) SuperNodes on 127.0.0.1 (each under a
# timeout, in its own process group, killed by PID at the end), then for every METHOD runs
# the same experiment twice — through Flower (one run per method, status from `flwr ls`) and
# with `oneshotfl run` — each with a fresh artefact cache, checks that the results are equal
# (`oneshotfl compare`), and prints one JSON line per method: our upload and download
# byte counts, Flower's network traffic from `flwr ls`, the wall time of each (submission to
# finished for Flower; the process for the local run). Loopback only.
# Knobs: PYTHON_BIN, MEASURE_PORT (default 19380), MEASURE_TIMEOUT (s per run, default 1800).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 \"key=value ...\" METHOD [METHOD ...]" >&2; exit 2; }
BASE=$1
shift
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${MEASURE_PORT:-19380}
LIMIT=${MEASURE_TIMEOUT:-1800}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-flower-measure.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 2
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  [ "$rc" -ne 0 ] && tail -n 30 "$WORK"/*.log >&2
  [ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM
py() { "$BIN/python" -c "$@"; }

clients=$(py "import sys, shlex; d=dict(t.split('=', 1) for t in shlex.split(sys.argv[1])); print(d.get('clients', 3))" "$BASE")
mkdir -p "$FLWR_HOME"
printf '[superlink]\ndefault = "m"\n\n[superlink.m]\naddress = "127.0.0.1:%s"\ninsecure = true\n' "$PORT" \
  >"$FLWR_HOME/config.toml"
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null
setsid timeout -k 5 "$LIMIT" flower-superlink --insecure --disable-runtime-dependency-installation \
  --host 127.0.0.1 --port "$PORT" --database "$WORK/link.db" >"$WORK/superlink.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do py "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null && break; sleep 0.3; done
for ((i = 0; i < clients; i++)); do
  setsid timeout -k 5 "$LIMIT" flower-supernode --insecure --superlink "127.0.0.1:$PORT" \
    --port $((PORT + 1 + i)) --node-config "partition-id=$i num-partitions=$clients" \
    >"$WORK/node-$i.log" 2>&1 &
  PIDS+=("$!")
done

n=0
for method in "$@"; do
  n=$((n + 1))
  t0=$(date +%s.%N)
  flwr run "$WORK/app" m --format json --run-config \
    "overrides='$BASE methods=$method cache_dir=$WORK/cache-flower-$n' out='$WORK/flower-$n'" \
    >"$WORK/submit-$n.json" 2>>"$WORK/submit.log"
  run_id=$(py "import json,sys; print(json.load(open(sys.argv[1]))['run-id'])" "$WORK/submit-$n.json")
  while :; do
    timeout 60 flwr ls m --run-id "$run_id" --format json >"$WORK/ls-$n.json" 2>>"$WORK/submit.log"
    status=$(py "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['status'])" "$WORK/ls-$n.json")
    case "$status" in finished:*) break ;; esac
    sleep 1
  done
  t1=$(date +%s.%N)
  [ "$status" = "finished:completed" ] || { echo "$method: Flower run ended '$status'" >&2; exit 1; }
  # shellcheck disable=SC2086
  timeout "$LIMIT" "$BIN/oneshotfl" run $BASE "methods=$method" "cache_dir=$WORK/cache-local-$n" \
    --out "$WORK/local-$n" >"$WORK/local-$n.log" 2>&1
  t2=$(date +%s.%N)
  "$BIN/oneshotfl" compare "$WORK/local-$n/result.json" "$WORK/flower-$n/result.json" >&2
  py "
import json, sys
ls = json.load(open(sys.argv[1]))['runs'][0]
m = json.load(open(sys.argv[2]))['methods'][0]
local = json.load(open(sys.argv[3]))
t0, t1, t2, clients = map(float, sys.argv[4:8])
up = sum(m['upload_bytes_per_client'])
down = m['download_bytes_per_client'] * int(clients)
traffic = ls['network-traffic']
print(json.dumps({
    'method': m['key'], 'clients': int(clients), 'accuracy': round(m['accuracy'], 4),
    'our_upload_bytes': up, 'our_download_bytes': down,
    'flwr_inbound_bytes': traffic['inbound-bytes'], 'flwr_outbound_bytes': traffic['outbound-bytes'],
    'flwr_overhead_bytes': traffic['total-bytes'] - up - down,
    'flower_wall_s': round(t1 - t0, 1), 'local_wall_s': round(t2 - t1, 1),
    'local_run_s': round(local['wall_time_s'], 1),
}))
" "$WORK/ls-$n.json" "$WORK/flower-$n/result.json" "$WORK/local-$n/result.json" "$t0" "$t1" "$t2" "$clients"
done
