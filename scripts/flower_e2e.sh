#!/usr/bin/env bash
# End-to-end test of the Flower adapter on loopback (127.0.0.1 only), as CI runs it.
#
#   1. the local simulation of a tiny experiment (the reference result), with star methods and
#      a peer method (peer_ensemble over a directed ring from a graph file, relayed by the
#      ServerApp to the one addressee of each message);
#   2. a SuperLink and 3 SuperNodes, insecure: flwr run, status from `flwr ls`, result compared;
#      then a bad node (garbage, an oversize upload, another architecture) refused and named
#      while the run completes, and a node that drops out (named; below the quorum the run fails);
#      then that node back with its own npz dataset, booked from what it reports;
#   3. the same with TLS and CLI-managed SuperNode authentication: 3 registered nodes run,
#      a 4th, unregistered node must be refused; then, with the deployment's binding of node
#      ids to client ids, a registered node claiming another node's client id is refused;
#   4. FOL on a 4-node ring (insecure, 4 SuperNodes): per-client results equal the local
#      simulation, and the bytes of every edge are counted.
#
# Every process runs under `timeout`, in its own process group, and is killed by its PID on
# exit. Exits non-zero on any failure. Needs the flower extra (scripts/bootstrap.sh with
# ONESHOTFL_EXTRAS=dev,flower). Environment knobs: PYTHON_BIN (default .venv/bin), E2E_PORT
# (first of 11 ports, default 19180), E2E_TIMEOUT (seconds per run, default 300), KEEP=1 keeps
# the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${E2E_PORT:-19180}
RUN_TIMEOUT=${E2E_TIMEOUT:-300}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-flower-e2e.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=1
PIDS=()

log() { echo "flower-e2e: [${SECONDS}s] $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in ${LOCAL_PIDS[@]+"${LOCAL_PIDS[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 2
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK"/logs/*.log; do [ -f "$f" ] && { log "--- tail of $f"; tail -n 25 "$f" >&2; }; done
  fi
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

# start NAME SECONDS CMD...: run CMD in its own process group under a timeout; remember its PID.
start() {
  local name=$1 limit=$2
  shift 2
  setsid timeout -k 5 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1 &
  PIDS+=("$!")
  echo "$!" >"$WORK/logs/$name.pid"
}

stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  PIDS=()
}

json_get() {  # json_get FILE PYTHON-EXPRESSION-ON-d
  "$BIN/python" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}

wait_port() {
  for _ in $(seq 100); do
    if "$BIN/python" -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$1" 2>/dev/null; then return 0; fi
    sleep 0.3
  done
  fail "nothing listens on 127.0.0.1:$1"
}

mkdir -p "$WORK/logs" "$FLWR_HOME"
# a directed ring 0 → 1 → 2 → 0: each node receives one neighbour's model, not everyone's
echo '{"directed": true, "edges": [[0, 1], [1, 2], [2, 0]]}' >"$WORK/graph.json"
# the federation both local references and their Flower runs share (digits, mlp clients)
COMMON="model: mlp
local_epochs: 1
local_steps: 0
batch_size: 32
lr: 0.05
alpha: 1.0
min_samples: 5"
cat >"$WORK/experiment.yaml" <<EOF
dataset: digits
clients: 3
$COMMON
device: cpu
graph: "file:path=$WORK/graph.json"
methods: [fedavg, ensemble, "fedavg_rounds:rounds=2", peer_ensemble]
EOF
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null

# TLS + node auth is checked on one method (the insecure run covers the methods themselves)
sed 's/^methods: .*/methods: [fedavg]/' "$WORK/experiment.yaml" >"$WORK/tls.yaml"
cat >"$WORK/ring.yaml" <<EOF
dataset: digits
clients: 4
$COMMON
val_fraction: 0.2
device: cpu
graph: ring
methods: ["fol:rounds=2:kd_epochs=1:weight_steps=20"]
EOF

# reference NAME CONFIG: the local simulation of CONFIG into $WORK/NAME, in the background.
declare -A LOCAL_PIDS=()
reference() {
  timeout 300 "$BIN/oneshotfl" run --config "$2" "cache_dir=$WORK/cache-$1" --out "$WORK/$1" \
    >"$WORK/logs/$1.log" 2>&1 &
  LOCAL_PIDS[$WORK/$1]=$!
}
log "local simulations (references), in the background while the SuperLinks start"
reference local "$WORK/experiment.yaml"
reference tls-local "$WORK/tls.yaml"
reference ring-local "$WORK/ring.yaml"

# submit NAME CONNECTION RUN-CONFIG: submit the app and wait until it finishes; the final
# status (from `flwr ls`: flwr run exits 0 even when the run fails) goes to $WORK/NAME-status.
# While the run goes on, the script looks for its result file every 0.2 s and asks `flwr ls`
# (a Python process of its own, which would take CPU from the run) only every 5 s.
submit() {
  local name=$1 conn=$2 run_id status="" deadline next_ls=0
  "$BIN/flwr" run "$WORK/app" "$conn" --format json --run-config "$3" \
    >"$WORK/$name-submit.json" 2>>"$WORK/logs/$name-submit.log" || fail "$name: flwr run failed"
  run_id=$(json_get "$WORK/$name-submit.json" "d['run-id']")
  log "$name: run $run_id submitted"
  deadline=$((SECONDS + RUN_TIMEOUT))
  while :; do
    if [ -f "$WORK/$name/result.json" ] || [ "$SECONDS" -ge "$next_ls" ]; then
      timeout 60 "$BIN/flwr" ls "$conn" --run-id "$run_id" --format json >"$WORK/$name-ls.json" \
        2>>"$WORK/logs/$name-submit.log" || fail "$name: flwr ls failed"
      status=$(json_get "$WORK/$name-ls.json" "d['runs'][0]['status']")
      case "$status" in finished:*) break ;; esac
      next_ls=$((SECONDS + 5))
    fi
    [ "$SECONDS" -lt "$deadline" ] || fail "$name: run $run_id still '$status' after ${RUN_TIMEOUT}s"
    sleep 0.2
  done
  echo "$status" >"$WORK/$name-status"
}

# flower_run NAME CONNECTION [CONFIG LOCAL]: submit, require finished:completed, compare with
# the local result.
flower_run() {
  local name=$1 conn=$2 config=${3:-$WORK/experiment.yaml} local=${4:-$WORK/local} status
  submit "$name" "$conn" "config='$config' out='$WORK/$name' node-timeout=60.0 reply-timeout=240.0"
  wait_local "$local"
  status=$(cat "$WORK/$name-status")
  [ "$status" = "finished:completed" ] || fail "$name: run ended '$status'"
  "$BIN/oneshotfl" compare "$local/result.json" "$WORK/$name/result.json" \
    || fail "$name: the result differs from the local simulation"
  log "$name: bytes on the wire (flwr ls): $(json_get "$WORK/$name-ls.json" "d['runs'][0]['network-traffic']")"
  log "$name: bytes we counted (uploads + downloads): $(json_get "$WORK/$name/result.json" \
    "sum(sum(m['upload_bytes_per_client']) + m['download_bytes_per_client'] * d['config']['clients'] for m in d['methods'])")"
}

# wait_local DIR: the background reference simulation writing DIR must have finished well.
wait_local() {
  local pid=${LOCAL_PIDS[$1]:-}
  [ -n "$pid" ] || return 0
  wait "$pid" || fail "the local simulation $1 failed (log: $WORK/logs/$(basename "$1").log)"
  LOCAL_PIDS[$1]=""
}

# online_nodes STAGE: how many SuperNodes the TLS SuperLink lists as online.
online_nodes() {
  timeout 60 "$BIN/flwr" supernode ls tls --format json >"$WORK/supernodes.json" \
    2>>"$WORK/logs/register.log" || fail "$1: flwr supernode ls failed"
  json_get "$WORK/supernodes.json" "sum(1 for n in d['nodes'] if str(n.get('status','')).lower() == 'online')"
}

node_config() { echo "partition-id=$1 num-partitions=${2:-3} cache-dir='$WORK/cache-node-$1'"; }

# --- 1. insecure ------------------------------------------------------------------------------
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "insecure"

[superlink.insecure]
address = "127.0.0.1:$PORT"
insecure = true

[superlink.tls]
address = "127.0.0.1:$((PORT + 1))"
root-certificates = "$WORK/certs/ca.crt"
EOF
log "insecure: SuperLink on 127.0.0.1:$PORT and 3 SuperNodes"
start superlink 600 flower-superlink --insecure --disable-runtime-dependency-installation \
  --host 127.0.0.1 --port "$PORT" --database "$WORK/insecure.db"
wait_port "$PORT"
for i in 0 1 2; do
  start "node-$i" 600 flower-supernode --insecure --superlink "127.0.0.1:$PORT" \
    --port $((PORT + 2 + i)) --node-config "$(node_config "$i")"
done
flower_run insecure insecure
edges=$(json_get "$WORK/insecure/result.json" "sorted((s, r) for m in d['methods'] if 'topology' in m for s, r, _ in m['topology']['edges'])")
[ "$edges" = "[(0, 1), (1, 2), (2, 0)]" ] || fail "relay: expected the directed ring's 3 edges, got $edges"
log "relay: peer_ensemble crossed exactly the edges of the directed ring: $edges"

submit_dropout() {  # submit_dropout NAME MIN_CLIENTS [OVERRIDES] -> final status in $WORK/NAME-status
  submit "$1" insecure "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=$2 cache_dir=$WORK/cache-drop ${3:-}' out='$WORK/$1' node-timeout=5.0 reply-timeout=15.0"
}
# A bad SuperNode: node 0 sends what the wire must refuse (garbage, an oversize upload, another
# architecture than configured, each made on the node by the `attack` setting); the run must
# complete with clients 1 and 2 and name client 0 in its refusals.
for attack in garbage oversize:mib=8 wrong_arch:arch=cnn; do
  name="bad-node-${attack%%:*}"
  submit_dropout "$name" 2 "malicious=1 attack=$attack"
  [ "$(cat "$WORK/$name-status")" = "finished:completed" ] || fail "$name: run ended $(cat "$WORK/$name-status")"
  used=$(json_get "$WORK/$name/result.json" "d['methods'][0]['clients_used']")
  refused=$(json_get "$WORK/$name/result.json" "d['methods'][0]['rejected'].get('0', '')")
  [ "$used" = "[1, 2]" ] || fail "$name: expected clients [1, 2] aggregated, got $used"
  case "$refused" in "client 0: "*) ;; *) fail "$name: expected client 0 refused and named, got '$refused'" ;; esac
  log "$name: node 0 refused ($refused); aggregated clients $used"
done

# Dropout: node 2 goes away; with min_clients=2 the server aggregates the other two and names
# client 2; with min_clients=3 the run must fail (and `flwr ls` must say so).
node2=$(cat "$WORK/logs/node-2.pid")
kill -TERM -- "-$node2"
for _ in $(seq 50); do kill -0 "$node2" 2>/dev/null || break; sleep 0.2; done
log "dropout: node 2 stopped, min_clients=2"
submit_dropout dropout 2
[ "$(cat "$WORK/dropout-status")" = "finished:completed" ] || fail "dropout: run ended $(cat "$WORK/dropout-status")"
used=$(json_get "$WORK/dropout/result.json" "d['methods'][0]['clients_used']")
missing=$(json_get "$WORK/dropout/result.json" "'client 2' in d['methods'][0]['no_reply']")
[ "$used" = "[0, 1]" ] || fail "dropout: expected clients [0, 1] aggregated, got $used"
[ "$missing" = True ] || fail "dropout: expected client 2 named in no_reply: $(json_get "$WORK/dropout/result.json" "d['methods'][0].get('no_reply')")"
log "dropout: aggregated clients $used; no_reply: $(json_get "$WORK/dropout/result.json" "d['methods'][0]['no_reply']")"
log "dropout: node 2 stopped, min_clients=3 (below the quorum)"
submit_dropout quorum 3
[ "$(cat "$WORK/quorum-status")" = "finished:failed" ] || fail "quorum: expected finished:failed, got $(cat "$WORK/quorum-status")"
log "quorum: the run failed as it must"

# Own data: node 2 comes back with its own npz (40 digits of classes 1 and 4) instead of a
# carved shard; the server books its size and labels from the node's report, never from its
# own copy of the data (which would give client 2 a shard of every class).
"$BIN/python" - "$WORK/own.npz" <<'PY'
import sys

import numpy as np
from sklearn.datasets import load_digits

d = load_digits()
keep = np.concatenate([np.flatnonzero(d.target == c)[:20] for c in (1, 4)])
np.savez(sys.argv[1], x=(d.images[keep] / 16).astype(np.float32), y=d.target[keep])
PY
start node-2-own 600 flower-supernode --insecure --superlink "127.0.0.1:$PORT" \
  --port $((PORT + 4)) \
  --node-config "$(node_config 2) dataset='npz:path=$WORK/own.npz:classes=10:mean=0.3:std=0.38'"
submit own-data insecure "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=3 max_client_examples=900 cache_dir=$WORK/cache-drop' out='$WORK/own-data' node-timeout=60.0 reply-timeout=120.0"
[ "$(cat "$WORK/own-data-status")" = "finished:completed" ] || fail "own-data: run ended $(cat "$WORK/own-data-status")"
used=$(json_get "$WORK/own-data/result.json" "d['methods'][0]['clients_used']")
row=$(json_get "$WORK/own-data/result.json" "(d['clients'][2]['train_size'], [c for c, n in enumerate(d['clients'][2]['label_histogram']) if n])")
[ "$used" = "[0, 1, 2]" ] || fail "own-data: expected clients [0, 1, 2] aggregated, got $used"
[ "$row" = "(40, [1, 4])" ] || fail "own-data: expected client 2 booked as it reported (40 examples of classes 1 and 4), got $row"
log "own-data: node 2 brought its own npz; the server booked (examples, classes) = $row"
stop_all

# --- 2. TLS + CLI-managed SuperNode authentication ----------------------------------------------
"$BIN/oneshotfl" flower certs "$WORK/certs" --nodes 5 >/dev/null
TLS_PORT=$((PORT + 1))
log "tls: SuperLink on 127.0.0.1:$TLS_PORT with TLS and --enable-supernode-auth"
start superlink-tls 600 flower-superlink --disable-runtime-dependency-installation \
  --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
  --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
  --host 127.0.0.1 --port "$TLS_PORT" --database "$WORK/tls.db"
wait_port "$TLS_PORT"
NODE_IDS=()
for i in 0 1 2; do
  timeout 60 "$BIN/flwr" supernode register "$WORK/certs/node-$i.pub" tls --format json \
    >"$WORK/register-$i.json" 2>>"$WORK/logs/register.log" || fail "tls: flwr supernode register node-$i failed"
  NODE_IDS+=("$(json_get "$WORK/register-$i.json" "d['node-id']")")
done
log "tls: registered node ids ${NODE_IDS[*]}"
for i in 0 1 2; do
  start "node-tls-$i" 600 flower-supernode --superlink "127.0.0.1:$TLS_PORT" \
    --root-certificates "$WORK/certs/ca.crt" --auth-supernode-private-key "$WORK/certs/node-$i" \
    --port $((PORT + 2 + i)) --node-config "$(node_config "$i")"
done
# node-3 holds a key pair the SuperLink never registered: it must be refused.
start node-unregistered 60 flower-supernode --superlink "127.0.0.1:$TLS_PORT" \
  --root-certificates "$WORK/certs/ca.crt" --auth-supernode-private-key "$WORK/certs/node-3" \
  --port $((PORT + 5)) --node-config "$(node_config 2)"
flower_run tls tls "$WORK/tls.yaml" "$WORK/tls-local"
online=$(online_nodes tls)
[ "$online" = 3 ] || fail "tls: expected exactly the 3 registered SuperNodes online, got $online"
pid=$(cat "$WORK/logs/node-unregistered.pid")
for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
kill -0 "$pid" 2>/dev/null && fail "tls: the unregistered SuperNode is still running"
rc=0; wait "$pid" || rc=$?
[ "$rc" -ne 0 ] || fail "tls: the unregistered SuperNode exited 0"
grep -q "Failed to activate SuperNode" "$WORK/logs/node-unregistered.log" \
  || fail "tls: the unregistered SuperNode did not report a refused activation"
log "tls: the unregistered SuperNode was refused"

# The deployment binds each registered node id (bound to its key by the SuperLink) to a
# client id. A 4th registered node (node-4) serves node 1's partition; bound to client 2 it
# must be refused and named, node-tls-2 (outside the binding) is not addressed, and the run
# completes with clients 0 and 1.
timeout 60 "$BIN/flwr" supernode register "$WORK/certs/node-4.pub" tls --format json \
  >"$WORK/register-4.json" 2>>"$WORK/logs/register.log" || fail "bind: flwr supernode register node-4 failed"
NODE_IDS+=("$(json_get "$WORK/register-4.json" "d['node-id']")")
binding="${NODE_IDS[0]}=0 ${NODE_IDS[1]}=1 ${NODE_IDS[3]}=2"
start node-4-claims-1 600 flower-supernode --superlink "127.0.0.1:$TLS_PORT" \
  --root-certificates "$WORK/certs/ca.crt" --auth-supernode-private-key "$WORK/certs/node-4" \
  --port $((PORT + 5)) --node-config "$(node_config 1)"
for _ in $(seq 30); do  # until node-4 is online beside the three
  online=$(online_nodes bind)
  [ "$online" -ge 4 ] && break
  sleep 0.5
done
[ "$online" -ge 4 ] || fail "bind: node-4 did not come online (online: $online)"
submit bind tls "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=2 cache_dir=$WORK/cache-bind' out='$WORK/bind' node-timeout=30.0 reply-timeout=120.0 node-clients='$binding'"
status=$(cat "$WORK/bind-status")
[ "$status" = "finished:completed" ] || fail "bind: run ended $status"
used=$(json_get "$WORK/bind/result.json" "d['methods'][0]['clients_used']")
refused=$(json_get "$WORK/bind/result.json" "[w for w in d['methods'][0]['no_reply'].values() if 'binds it to client 2' in w]")
addressed=$(json_get "$WORK/bind/result.json" "sorted(d['flower']['node_clients'].values())")
[ "$used" = "[0, 1]" ] || fail "bind: expected clients [0, 1] aggregated, got $used"
[ "$refused" != "[]" ] || fail "bind: expected node ${NODE_IDS[3]}'s claim refused and named, got $(json_get "$WORK/bind/result.json" "d['methods'][0]['no_reply']")"
[ "$addressed" = "[0, 1]" ] || fail "bind: expected only the bound nodes of clients 0 and 1 to answer, got $addressed"
log "bind: node ${NODE_IDS[3]} (bound to client 2) claimed client 1 and was refused: $refused"
stop_all

# --- 4. FOL on a 4-node ring ---------------------------------------------------------------------
RING_PORT=$((PORT + 6))
log "ring: SuperLink on 127.0.0.1:$RING_PORT and 4 SuperNodes"
start superlink-ring 600 flower-superlink --insecure --disable-runtime-dependency-installation \
  --host 127.0.0.1 --port "$RING_PORT" --database "$WORK/ring.db"
wait_port "$RING_PORT"
for i in 0 1 2 3; do
  start "node-ring-$i" 600 flower-supernode --insecure --superlink "127.0.0.1:$RING_PORT" \
    --port $((PORT + 7 + i)) --node-config "$(node_config "$i" 4)"
done
cat >>"$FLWR_HOME/config.toml" <<EOF

[superlink.ring]
address = "127.0.0.1:$RING_PORT"
insecure = true
EOF
flower_run ring ring "$WORK/ring.yaml" "$WORK/ring-local"
same=$(json_get "$WORK/ring/result.json" "d['methods'][0]['client_personal_accuracy']")
[ "$same" = "$(json_get "$WORK/ring-local/result.json" "d['methods'][0]['client_personal_accuracy']")" ] \
  || fail "ring: per-client results differ from the local simulation"
pairs=$(json_get "$WORK/ring/result.json" "sorted((s, r) for s, r, _ in d['methods'][0]['topology']['edges'])")
[ "$pairs" = "[(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (2, 3), (3, 0), (3, 2)]" ] \
  || fail "ring: expected the ring's 8 directed edges, got $pairs"
log "ring: FOL per-client personal accuracy equals the local simulation: $same"
log "ring: bytes per edge (sender, receiver, bytes): $(json_get "$WORK/ring/result.json" "sorted(tuple(e) for e in d['methods'][0]['topology']['edges'])")"
stop_all
log "PASSED: insecure and TLS + node auth runs, and FOL on a 4-node ring, equal the local simulation"
