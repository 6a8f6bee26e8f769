#!/usr/bin/env bash
# End-to-end test of the Flower adapter on loopback (127.0.0.1 only), as CI runs it.
#
# Three federations, each with its own SuperLink, run side by side (three "lanes"; every
# check of a lane runs in order, the lanes do not wait for one another):
#
#   insecure  a SuperLink and 3 SuperNodes. The local simulation of a tiny experiment (star
#             methods, and a peer method, peer_ensemble over a directed ring from a graph
#             file, relayed by the ServerApp to the one addressee of each message) against
#             its Flower run, with status from `flwr ls`. Then a node that drops out (named;
#             below the quorum the run fails: two runs at once), and that node back with its
#             own npz dataset, booked from what it reports;
#   tls       the same with TLS and CLI-managed SuperNode authentication: 3 registered nodes
#             run, a 4th, unregistered node must be refused; then, with the deployment's
#             binding of node ids to client ids, a registered node claiming another node's
#             client id is refused;
#   ring      FOL on a 4-node ring (insecure, 4 SuperNodes): per-client results equal the
#             local simulation, and the bytes of every edge are counted; at the same time, on
#             the same nodes, three bad nodes (garbage, an oversize upload, another
#             architecture) refused and named while their run completes with the fourth.
#
# Every process runs under `timeout`, in its own process group, and is killed by its PID on
# exit. No check waits on a clock of its own except the dropout stage, which must wait out
# the stopped node (`DROP_TIMEOUT`); every other run ends when its nodes have answered.
# Exits non-zero on any failure, with the tail of every log. Needs the flower extra
# (scripts/bootstrap.sh with ONESHOTFL_EXTRAS=dev,flower). Environment knobs: PYTHON_BIN
# (default .venv/bin), E2E_PORT (first of 16 ports, default 19180), E2E_TIMEOUT (seconds per
# run, default 480), E2E_PROC_TIMEOUT (seconds a SuperLink or SuperNode may live, default
# 1800: a lane's processes outlive all of its runs on a slow machine), DROP_TIMEOUT (seconds the dropout runs wait for a node's reply, default
# 90: the nodes that are up must answer within it, under whatever load the machine has; the
# SuperLink itself gives up on a stopped node once it misses two heartbeats, 30 s apart,
# which usually ends the wait sooner), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${E2E_PORT:-19180}
RUN_TIMEOUT=${E2E_TIMEOUT:-480}
PROC_TIMEOUT=${E2E_PROC_TIMEOUT:-1800}
DROP_TIMEOUT=${DROP_TIMEOUT:-90}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-flower-e2e.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=1
LANES=()

log() { echo "flower-e2e: [${SECONDS}s] $*" >&2; }
fail() { log "FAILED: $*"; echo "$*" >>"$WORK/failures"; exit 1; }

# kill_group PATTERN: stop the process groups whose PID files match $WORK/logs/PATTERN.pid.
kill_group() {
  local f pid pids=()
  for f in "$WORK"/logs/$1.pid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}

cleanup() {
  local rc=$?
  for pid in ${LANES[@]+"${LANES[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  kill_group '*'
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK"/logs/*.log; do [ -f "$f" ] && { log "--- tail of $f"; tail -n 25 "$f" >&2; }; done
    # the reasons again, last: a CI log that shows only its end still says what failed
    if [ -f "$WORK/failures" ]; then
      while read -r line; do log "FAILED: $line"; done <"$WORK/failures"
    fi
  fi
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

# start NAME SECONDS CMD...: run CMD in its own process group under a timeout; its PID goes
# to $WORK/logs/NAME.pid (lanes are subshells: the files are how the cleanup finds them all).
start() {
  local name=$1 limit=$2
  shift 2
  setsid timeout -k 5 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1 &
  echo "$!" >"$WORK/logs/$name.pid"
}

json_get() {  # json_get FILE PYTHON-EXPRESSION-ON-d
  "$BIN/python" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}

wait_port() {
  for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
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
methods: [ensemble, "fedavg_rounds:rounds=2", peer_ensemble]
EOF
# The insecure run covers a one-shot star method, a multi-round one (its round 0 is FedAvg's
# one-shot upload) and a relayed peer method; plain fedavg, which every other run uses, is
# compared with the local simulation under TLS + node auth.
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
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null
"$BIN/oneshotfl" flower certs "$WORK/certs" --nodes 5 >/dev/null

INSECURE_PORT=$PORT TLS_PORT=$((PORT + 1)) RING_PORT=$((PORT + 2))
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "insecure"

[superlink.insecure]
address = "127.0.0.1:$INSECURE_PORT"
insecure = true

[superlink.tls]
address = "127.0.0.1:$TLS_PORT"
root-certificates = "$WORK/certs/ca.crt"

[superlink.ring]
address = "127.0.0.1:$RING_PORT"
insecure = true
EOF

# reference NAME CONFIG: the local simulation of CONFIG into $WORK/NAME, in the background of
# the calling lane (wait_local waits for it there).
declare -A LOCAL_PIDS=()
reference() {
  timeout "$RUN_TIMEOUT" "$BIN/oneshotfl" run --config "$2" "cache_dir=$WORK/cache-$1" --out "$WORK/$1" \
    >"$WORK/logs/$1.log" 2>&1 &
  LOCAL_PIDS[$WORK/$1]=$!
}

# wait_local DIR: the background reference simulation writing DIR must have finished well.
wait_local() {
  local pid=${LOCAL_PIDS[$1]:-}
  [ -n "$pid" ] || return 0
  wait "$pid" || fail "the local simulation $1 failed (log: $WORK/logs/$(basename "$1").log)"
  LOCAL_PIDS[$1]=""
}

# run_status NAME CONNECTION RUN-ID: `flwr ls` of the run into $WORK/NAME-ls.json. A SuperLink
# busy with other runs may not answer in time (three federations share two cores; on a slower
# CPU one `flwr ls` was seen to wait past 60 s three times in a row while the runs still
# finished): up to 6 tries, then fail with what it said.
run_status() {
  local try
  for try in 1 2 3 4 5 6; do
    timeout 60 "$BIN/flwr" ls "$2" --run-id "$3" --format json >"$WORK/$1-ls.json" \
      2>>"$WORK/logs/$1-submit.log" && return 0
    echo "flwr ls, try $try: $(head -c 400 "$WORK/$1-ls.json")" >>"$WORK/logs/$1-submit.log"
    sleep 2
  done
  fail "$1: flwr ls failed 6 times; the last said: $(head -c 400 "$WORK/$1-ls.json")"
}

# submit NAME CONNECTION RUN-CONFIG: submit the app and wait until it finishes; the final
# status (from `flwr ls`: flwr run exits 0 even when the run fails) goes to $WORK/NAME-status.
# The script looks for the run's result file every 0.2 s and asks `flwr ls` (a Python
# process of its own, which takes CPU from the runs) about every second once the file is
# there, and otherwise only every LS_EVERY seconds (default 15), to see a run that failed.
submit() {
  local name=$1 conn=$2 run_id status="" deadline next_ls
  "$BIN/flwr" run "$WORK/app" "$conn" --format json --run-config "$3" \
    >"$WORK/$name-submit.json" 2>>"$WORK/logs/$name-submit.log" || fail "$name: flwr run failed"
  run_id=$(json_get "$WORK/$name-submit.json" "d['run-id']")
  log "$name: run $run_id submitted"
  deadline=$((SECONDS + RUN_TIMEOUT))
  next_ls=$((SECONDS + ${LS_EVERY:-15}))
  while :; do
    if [ -f "$WORK/$name/result.json" ] || [ "$SECONDS" -ge "$next_ls" ]; then
      run_status "$name" "$conn" "$run_id"
      status=$(json_get "$WORK/$name-ls.json" "d['runs'][0]['status']")
      case "$status" in finished:*) break ;; esac
      next_ls=$((SECONDS + ${LS_EVERY:-15}))
      if [ -f "$WORK/$name/result.json" ]; then sleep 0.8; fi  # written: the run ends soon
    fi
    [ "$SECONDS" -lt "$deadline" ] || fail "$name: run $run_id still '$status' after ${RUN_TIMEOUT}s"
    sleep 0.2
  done
  echo "$status" >"$WORK/$name-status"
}

# together PID...: wait for background jobs (submissions, registrations); fail if any failed.
together() {
  local pid rc=0
  for pid in "$@"; do wait "$pid" || rc=1; done
  [ "$rc" -eq 0 ] || fail "a job run beside others failed (see above)"
}

# flower_check NAME CONNECTION [LOCAL]: require finished:completed, compare with the local
# result, log the bytes.
flower_check() {
  local name=$1 local=${2:-$WORK/local} status
  wait_local "$local"
  status=$(cat "$WORK/$name-status")
  [ "$status" = "finished:completed" ] || fail "$name: run ended '$status'"
  "$BIN/oneshotfl" compare "$local/result.json" "$WORK/$name/result.json" >"$WORK/logs/$name-compare.log" \
    || fail "$name: the result differs from the local simulation ($(cat "$WORK/logs/$name-compare.log"))"
  log "$name: equal to the local simulation ($(tail -n 1 "$WORK/logs/$name-compare.log"))"
  log "$name: bytes on the wire (flwr ls): $(json_get "$WORK/$name-ls.json" "d['runs'][0]['network-traffic']")"
  log "$name: bytes we counted (uploads + downloads): $(json_get "$WORK/$name/result.json" \
    "sum(sum(m['upload_bytes_per_client']) + m['download_bytes_per_client'] * d['config']['clients'] for m in d['methods'])")"
}

node_config() { echo "partition-id=$1 num-partitions=${2:-3} cache-dir='$WORK/cache-$3-node-$1'"; }

# --- insecure: methods, bad nodes, dropout, own data ---------------------------------------
lane_insecure() {
  reference local "$WORK/experiment.yaml"
  log "insecure: SuperLink on 127.0.0.1:$INSECURE_PORT and 3 SuperNodes"
  start a-superlink "$PROC_TIMEOUT" flower-superlink --insecure --disable-runtime-dependency-installation \
    --host 127.0.0.1 --port "$INSECURE_PORT" --database "$WORK/insecure.db"
  wait_port "$INSECURE_PORT"
  for i in 0 1 2; do
    start "a-node-$i" "$PROC_TIMEOUT" flower-supernode --insecure --superlink "127.0.0.1:$INSECURE_PORT" \
      --port $((PORT + 3 + i)) --node-config "$(node_config "$i" 3 insecure)"
  done
  local pids=() used edges
  submit insecure insecure "config='$WORK/experiment.yaml' out='$WORK/insecure' node-timeout=60.0 reply-timeout=240.0"
  flower_check insecure
  edges=$(json_get "$WORK/insecure/result.json" "sorted((s, r) for m in d['methods'] if 'topology' in m for s, r, _ in m['topology']['edges'])")
  [ "$edges" = "[(0, 1), (1, 2), (2, 0)]" ] || fail "relay: expected the directed ring's 3 edges, got $edges"
  log "relay: peer_ensemble crossed exactly the edges of the directed ring: $edges"

  # Dropout: node 2 goes away; with min_clients=2 the server aggregates the other two and
  # names client 2; with min_clients=3 the run must fail (and `flwr ls` must say so). Both
  # runs at once: each waits DROP_TIMEOUT seconds for the stopped node.
  kill_group a-node-2
  log "dropout: node 2 stopped; min_clients=2 and, beside it, min_clients=3 (below the quorum)"
  local drop="node-timeout=5.0 reply-timeout=$DROP_TIMEOUT"
  pids=()
  submit dropout insecure "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=2 cache_dir=$WORK/cache-dropout' out='$WORK/dropout' $drop" &
  pids+=("$!")
  LS_EVERY=5 submit quorum insecure "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=3 cache_dir=$WORK/cache-quorum' out='$WORK/quorum' $drop" &
  pids+=("$!")
  together "${pids[@]}"
  [ "$(cat "$WORK/dropout-status")" = "finished:completed" ] || fail "dropout: run ended $(cat "$WORK/dropout-status")"
  used=$(json_get "$WORK/dropout/result.json" "d['methods'][0]['clients_used']")
  local missing
  missing=$(json_get "$WORK/dropout/result.json" "'client 2' in d['methods'][0]['no_reply']")
  [ "$used" = "[0, 1]" ] || fail "dropout: expected clients [0, 1] aggregated, got $used"
  [ "$missing" = True ] || fail "dropout: expected client 2 named in no_reply: $(json_get "$WORK/dropout/result.json" "d['methods'][0].get('no_reply')")"
  log "dropout: aggregated clients $used; no_reply: $(json_get "$WORK/dropout/result.json" "d['methods'][0]['no_reply']")"
  [ "$(cat "$WORK/quorum-status")" = "finished:failed" ] || fail "quorum: expected finished:failed, got $(cat "$WORK/quorum-status")"
  local why
  why=$(json_get "$WORK/quorum/result.json" "d['failed_methods']['fedavg']")
  case "$why" in *"expected at least 3"*) ;; *) fail "quorum: expected result.json to name the failed quorum, got: $why" ;; esac
  log "quorum: the run failed as it must, its result written: $why"

  # Own data: node 2 comes back with its own npz (40 digits of classes 1 and 4) instead of a
  # carved shard; the server books its size and labels from the node's report, never from
  # its own copy of the data (which would give client 2 a shard of every class).
  "$BIN/python" - "$WORK/own.npz" <<'PY'
import sys

import numpy as np
from sklearn.datasets import load_digits

d = load_digits()
keep = np.concatenate([np.flatnonzero(d.target == c)[:20] for c in (1, 4)])
np.savez(sys.argv[1], x=(d.images[keep] / 16).astype(np.float32), y=d.target[keep])
PY
  start a-node-2-own "$PROC_TIMEOUT" flower-supernode --insecure --superlink "127.0.0.1:$INSECURE_PORT" \
    --port $((PORT + 6)) \
    --node-config "$(node_config 2 3 insecure) dataset='npz:path=$WORK/own.npz:classes=10:mean=0.3:std=0.38'"
  submit own-data insecure "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=3 max_client_examples=900 cache_dir=$WORK/cache-own' out='$WORK/own-data' node-timeout=60.0 reply-timeout=240.0"
  [ "$(cat "$WORK/own-data-status")" = "finished:completed" ] || fail "own-data: run ended $(cat "$WORK/own-data-status")"
  used=$(json_get "$WORK/own-data/result.json" "d['methods'][0]['clients_used']")
  local row
  row=$(json_get "$WORK/own-data/result.json" "(d['clients'][2]['train_size'], [c for c, n in enumerate(d['clients'][2]['label_histogram']) if n])")
  [ "$used" = "[0, 1, 2]" ] || fail "own-data: expected clients [0, 1, 2] aggregated, got $used"
  [ "$row" = "(40, [1, 4])" ] || fail "own-data: expected client 2 booked as it reported (40 examples of classes 1 and 4), got $row"
  log "own-data: node 2 brought its own npz; the server booked (examples, classes) = $row"
  kill_group 'a-*'
}

# online_nodes STAGE: how many SuperNodes the TLS SuperLink lists as online.
online_nodes() {
  timeout 60 "$BIN/flwr" supernode ls tls --format json >"$WORK/supernodes.json" \
    2>>"$WORK/logs/register.log" || fail "$1: flwr supernode ls failed"
  json_get "$WORK/supernodes.json" "sum(1 for n in d['nodes'] if str(n.get('status','')).lower() == 'online')"
}

# register I: register node I's public key with the TLS SuperLink; prints its node id.
register() {
  timeout 60 "$BIN/flwr" supernode register "$WORK/certs/node-$1.pub" tls --format json \
    >"$WORK/register-$1.json" 2>>"$WORK/logs/register.log" || fail "tls: flwr supernode register node-$1 failed"
  json_get "$WORK/register-$1.json" "d['node-id']"
}

# tls_node NAME SECONDS KEY PORT PARTITION: a SuperNode with TLS and the private key KEY.
tls_node() {
  start "$1" "$2" flower-supernode --superlink "127.0.0.1:$TLS_PORT" \
    --root-certificates "$WORK/certs/ca.crt" --auth-supernode-private-key "$WORK/certs/node-$3" \
    --port "$4" --node-config "$(node_config "$5" 3 tls)"
}

# --- tls: TLS + CLI-managed SuperNode authentication --------------------------------------------
lane_tls() {
  reference tls-local "$WORK/tls.yaml"
  log "tls: SuperLink on 127.0.0.1:$TLS_PORT with TLS and --enable-supernode-auth"
  start b-superlink "$PROC_TIMEOUT" flower-superlink --disable-runtime-dependency-installation \
    --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
    --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
    --host 127.0.0.1 --port "$TLS_PORT" --database "$WORK/tls.db"
  wait_port "$TLS_PORT"
  local ids=() i pids=()
  for i in 0 1 2; do register "$i" >"$WORK/node-id-$i" & pids+=("$!"); done
  together "${pids[@]}"
  for i in 0 1 2; do ids+=("$(cat "$WORK/node-id-$i")"); done
  log "tls: registered node ids ${ids[*]}"
  for i in 0 1 2; do tls_node "b-node-$i" "$PROC_TIMEOUT" "$i" $((PORT + 7 + i)) "$i"; done
  # node-3 holds a key pair the SuperLink never registered: it must be refused.
  tls_node b-node-unregistered 60 3 $((PORT + 10)) 2
  submit tls tls "config='$WORK/tls.yaml' out='$WORK/tls' node-timeout=60.0 reply-timeout=240.0"
  flower_check tls "$WORK/tls-local"
  local online pid rc
  online=$(online_nodes tls)
  [ "$online" = 3 ] || fail "tls: expected exactly the 3 registered SuperNodes online, got $online"
  pid=$(cat "$WORK/logs/b-node-unregistered.pid")
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && fail "tls: the unregistered SuperNode is still running"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" -ne 0 ] || fail "tls: the unregistered SuperNode exited 0"
  grep -q "Failed to activate SuperNode" "$WORK/logs/b-node-unregistered.log" \
    || fail "tls: the unregistered SuperNode did not report a refused activation"
  log "tls: the unregistered SuperNode was refused"

  # The deployment binds each registered node id (bound to its key by the SuperLink) to a
  # client id. A 4th registered node (node-4) serves node 1's partition; bound to client 2 it
  # must be refused and named, node-tls-2 (outside the binding) is not addressed, and the
  # run completes with clients 0 and 1.
  ids+=("$(register 4)")
  local binding="${ids[0]}=0 ${ids[1]}=1 ${ids[3]}=2"
  tls_node b-node-4-claims-1 "$PROC_TIMEOUT" 4 $((PORT + 11)) 1
  for _ in $(seq 60); do  # until node-4 is online beside the three
    online=$(online_nodes bind)
    [ "$online" -ge 4 ] && break
    sleep 0.5
  done
  [ "$online" -ge 4 ] || fail "bind: node-4 did not come online (online: $online)"
  submit bind tls "config='$WORK/experiment.yaml' overrides='methods=fedavg min_clients=2 cache_dir=$WORK/cache-bind' out='$WORK/bind' node-timeout=30.0 reply-timeout=240.0 node-clients='$binding'"
  local status used refused addressed
  status=$(cat "$WORK/bind-status")
  [ "$status" = "finished:completed" ] || fail "bind: run ended $status"
  used=$(json_get "$WORK/bind/result.json" "d['methods'][0]['clients_used']")
  refused=$(json_get "$WORK/bind/result.json" "[w for w in d['methods'][0]['no_reply'].values() if 'binds it to client 2' in w]")
  addressed=$(json_get "$WORK/bind/result.json" "sorted(d['flower']['node_clients'].values())")
  [ "$used" = "[0, 1]" ] || fail "bind: expected clients [0, 1] aggregated, got $used"
  [ "$refused" != "[]" ] || fail "bind: expected node ${ids[3]}'s claim refused and named, got $(json_get "$WORK/bind/result.json" "d['methods'][0]['no_reply']")"
  [ "$addressed" = "[0, 1]" ] || fail "bind: expected only the bound nodes of clients 0 and 1 to answer, got $addressed"
  log "bind: node ${ids[3]} (bound to client 2) claimed client 1 and was refused: $refused"
  kill_group 'b-*'
}

# --- ring: FOL on a 4-node ring -----------------------------------------------------------------
lane_ring() {
  reference ring-local "$WORK/ring.yaml"
  log "ring: SuperLink on 127.0.0.1:$RING_PORT and 4 SuperNodes"
  start c-superlink "$PROC_TIMEOUT" flower-superlink --insecure --disable-runtime-dependency-installation \
    --host 127.0.0.1 --port "$RING_PORT" --database "$WORK/ring.db"
  wait_port "$RING_PORT"
  local i same pairs
  for i in 0 1 2 3; do
    start "c-node-$i" "$PROC_TIMEOUT" flower-supernode --insecure --superlink "127.0.0.1:$RING_PORT" \
      --port $((PORT + 12 + i)) --node-config "$(node_config "$i" 4 ring)"
  done
  # Beside FOL, on the same nodes, bad SuperNodes: nodes 0, 1 and 2 send what the wire must
  # refuse (garbage, an oversize upload, another architecture than configured: the three
  # attacks of the run's `attack` setting, dealt out in turn, each made on its node); the run
  # must complete with client 3 alone and name each of the three with its own reason. Every
  # node is up, so nothing waits on a clock.
  submit ring ring "config='$WORK/ring.yaml' out='$WORK/ring' node-timeout=60.0 reply-timeout=240.0" &
  local pids=("$!") used refused attacks="garbage+oversize:mib=8+wrong_arch:arch=cnn"
  submit bad-nodes ring "config='$WORK/ring.yaml' overrides='methods=fedavg min_clients=1 cache_dir=$WORK/cache-bad malicious=3 attack=$attacks' out='$WORK/bad-nodes' node-timeout=60.0 reply-timeout=240.0" &
  pids+=("$!")
  together "${pids[@]}"
  [ "$(cat "$WORK/bad-nodes-status")" = "finished:completed" ] || fail "bad-nodes: run ended $(cat "$WORK/bad-nodes-status")"
  used=$(json_get "$WORK/bad-nodes/result.json" "d['methods'][0]['clients_used']")
  [ "$used" = "[3]" ] || fail "bad-nodes: expected client 3 alone aggregated, got $used"
  for i in 0 1 2; do
    refused=$(json_get "$WORK/bad-nodes/result.json" "d['methods'][0]['rejected'].get('$i', '')")
    case "$refused" in "client $i: "*) ;; *) fail "bad-nodes: expected client $i refused and named, got '$refused'" ;; esac
    log "bad-nodes: node $i ($(json_get "$WORK/bad-nodes/result.json" "d['clients'][$i]['malicious']")) refused: $refused"
  done
  log "bad-nodes: aggregated clients $used"
  flower_check ring "$WORK/ring-local"
  same=$(json_get "$WORK/ring/result.json" "d['methods'][0]['client_personal_accuracy']")
  [ "$same" = "$(json_get "$WORK/ring-local/result.json" "d['methods'][0]['client_personal_accuracy']")" ] \
    || fail "ring: per-client results differ from the local simulation"
  pairs=$(json_get "$WORK/ring/result.json" "sorted((s, r) for s, r, _ in d['methods'][0]['topology']['edges'])")
  [ "$pairs" = "[(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (2, 3), (3, 0), (3, 2)]" ] \
    || fail "ring: expected the ring's 8 directed edges, got $pairs"
  log "ring: FOL per-client personal accuracy equals the local simulation: $same"
  log "ring: bytes per edge (sender, receiver, bytes): $(json_get "$WORK/ring/result.json" "sorted(tuple(e) for e in d['methods'][0]['topology']['edges'])")"
  kill_group 'c-*'
}

log "three federations side by side: insecure, tls, ring"
lane_insecure & LANES+=("$!")
lane_tls & LANES+=("$!")
lane_ring & LANES+=("$!")
failed=()
for i in 0 1 2; do
  wait "${LANES[$i]}" || failed+=("$(echo insecure tls ring | cut -d' ' -f$((i + 1)))")
done
LANES=()
[ ${#failed[@]} -eq 0 ] || fail "lane(s) ${failed[*]} failed (see above)"
log "PASSED: insecure and TLS + node auth runs, and FOL on a 4-node ring, equal the local simulation"
