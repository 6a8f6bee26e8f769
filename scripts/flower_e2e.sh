#!/usr/bin/env bash
# End-to-end test of the Flower adapter on loopback (127.0.0.1 only), as CI runs it, under
# faults: one deployment, every scenario on its processes.
#
# One SuperLink with TLS and CLI-managed SuperNode authentication, persisting its state
# (`--database`), and eight SuperNodes: node-0 … node-3 (the clients 0-3 of the federations
# below), node-frozen and node-killed (clients 1 and 2 of the fault runs), node-own (client 1,
# with its own npz dataset) and an unregistered one. A node serves any run its binding names:
# every run gives the SuperLink's node ids of its clients (`node-clients`), so the runs share
# the nodes and go side by side. Then, with the SuperLink's processes only:
#
#   main     ensemble, fedavg_rounds (2 rounds: its round 0 is FedAvg's one-shot upload) and
#            peer_ensemble over a directed ring 0 → 1 → 2 → 0 read from a graph file (relayed by
#            the ServerApp to the one addressee of each message) on clients 0-2: equal to the
#            local simulation, its status from `flwr ls`, the bytes counted;
#   ring     FOL on a 4-node ring: per-client results equal to the local simulation, the bytes
#            of every edge counted;
#   bad      on the same nodes at the same time, three bad nodes (garbage, an oversize upload,
#            another architecture: the run's `attack` setting dealt out in turn) refused and
#            named, the run complete with the fourth;
#   bind     the deployment's binding of node ids to client ids, with a node that brought its
#            own data: node-3 bound to client 2 answers for its own client 3 and is refused and
#            named; node-own answers as client 1 from its own npz (40 digits of classes 1 and 4)
#            and the server books it from what it reports; nodes outside the binding are not
#            addressed; the run completes with clients 0 and 1;
#   refused  the unregistered SuperNode is refused; the registered ones are online;
#   faults   fedavg on clients 0-3 while client 0's node sends garbage, node-frozen
#            is frozen (SIGSTOP) and node-killed is killed (SIGKILL) at work: the run completes
#            with client 3, naming each; beside it, the quorum: min_clients = 4 must end failed
#            with its result written (scripts/flower_lib.sh);
#   restart  the SuperLink killed once a run's first method is written and started again on its
#            database: the run resumes, or ends failed with what finished written;
#   lost     the SuperLink started without its database does not know the run.
#
# The first six go side by side, so one run's waiting (the faults wait until the SuperLink
# declares the frozen and killed nodes unavailable, two missed 30 s heartbeats) overlaps the
# others' work; restart and lost go last (they take the SuperLink down). Every process runs under
# `timeout`, in its own process group, and is killed by its PID on exit; every wait is a
# readiness check with a deadline. Each instruction starts a ClientApp process (a Python process
# importing torch: ~10 CPU-seconds on this 2-core machine), so the checks share runs and nodes
# where they can. Exits non-zero on any failure, with the tail of every log. Needs the flower
# extra (scripts/bootstrap.sh with ONESHOTFL_EXTRAS=dev,flower). Environment knobs: PYTHON_BIN
# (default .venv/bin), E2E_PORT (first of 10 ports, default 19180), E2E_TIMEOUT (seconds per
# run, default 600), E2E_REPLY (the runs' reply timeout, default 300: the nodes that are up must
# answer within it, under whatever load the machine has), E2E_FAULT_REPLY (the reply timeout of
# the fault, quorum and restart runs, default 240: the frozen and the killed node are named when
# it runs out (the SuperLink did not declare them unavailable in these runs), so it bounds the
# fault stage, which runs fedavg alone (one round to wait out); the good nodes must answer
# within it, and a SuperNode takes one message at a time: with 150 s, one good node's answer
# to the quorum run came too late on this 2-core machine), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${E2E_PORT:-19180}
RUN_TIMEOUT=${E2E_TIMEOUT:-600}
REPLY=${E2E_REPLY:-300}
FAULT_REPLY=${E2E_FAULT_REPLY:-240}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-flower-e2e.XXXXXX")
TAG=flower-e2e
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0 OMP_NUM_THREADS=1
# shellcheck source=scripts/flower_lib.sh
source scripts/flower_lib.sh
LINK_PORT=$PORT
TIMEOUTS="reply-timeout=$REPLY.0"

cleanup() {
  local rc=$? f
  for f in "$WORK"/logs/*.pid; do [ -f "$f" ] && kill_tree CONT "$(cat "$f")" && kill_tree KILL "$(cat "$f")"; done
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK"/logs/*.log; do [ -f "$f" ] && { log "--- tail of $f"; tail -n 25 "$f" >&2; }; done
    # the reasons again, last: a CI log that shows only its end still says what failed
    if [ -f "$WORK/failures" ]; then
      while read -r line; do log "FAILED: $line"; done <"$WORK/failures"
    fi
  fi
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else remove_work; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

mkdir -p "$WORK/logs" "$FLWR_HOME"
listening "$PORT" && fail "127.0.0.1:$PORT is in use (another SuperLink?): set E2E_PORT"
# a directed ring 0 → 1 → 2 → 0: each node receives one neighbour's model, not everyone's
echo '{"directed": true, "edges": [[0, 1], [1, 2], [2, 0]]}' >"$WORK/graph.json"
COMMON="dataset: digits
model: mlp
local_epochs: 1
local_steps: 0
batch_size: 32
lr: 0.05
alpha: 1.0
min_samples: 5
device: cpu"
cat >"$WORK/main.yaml" <<EOF
$COMMON
clients: 3
graph: "file:path=$WORK/graph.json"
methods: [ensemble, "fedavg_rounds:rounds=2", peer_ensemble]
EOF
cat >"$WORK/ring.yaml" <<EOF
$COMMON
clients: 4
val_fraction: 0.2
graph: ring
methods: ["fol:rounds=2:kd_epochs=1:weight_steps=20"]
EOF
cat >"$WORK/four.yaml" <<EOF
$COMMON
clients: 4
methods: [fedavg]
EOF
# node-own's data: 40 digits of classes 1 and 4 instead of a carved shard
"$BIN/python" - "$WORK/own.npz" <<'PY'
import sys

import numpy as np
from sklearn.datasets import load_digits

d = load_digits()
keep = np.concatenate([np.flatnonzero(d.target == c)[:20] for c in (1, 4)])
np.savez(sys.argv[1], x=(d.images[keep] / 16).astype(np.float32), y=d.target[keep])
PY
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null
"$BIN/oneshotfl" flower certs "$WORK/certs" --nodes 8 >/dev/null
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "e2e"

[superlink.e2e]
address = "127.0.0.1:$PORT"
root-certificates = "$WORK/certs/ca.crt"
EOF

# the local simulations the Flower runs must equal, in the background from the start (their
# exit status lands in $WORK/local-NAME.rc)
for name in main ring; do
  { rc=0; timeout "$RUN_TIMEOUT" "$BIN/oneshotfl" run --config "$WORK/$name.yaml" \
      "cache_dir=$WORK/cache-local-$name" --out "$WORK/local-$name" >"$WORK/logs/local-$name.log" 2>&1 || rc=$?
    echo "$rc" >"$WORK/local-$name.rc"; } &
done

link_up() {
  start link 1800 flower-superlink --disable-runtime-dependency-installation \
    --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
    --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
    --host 127.0.0.1 --port "$PORT" --database "$WORK/link.db"
  wait_port "$PORT"
}
log "SuperLink with TLS and node auth on 127.0.0.1:$PORT"
link_up
# refused: the unregistered SuperNode exits, refused; every node online is a registered one
check_refused() {
  local k rc=0 strangers
  for k in 0 1 2 3 4 5 6; do wait_log "${NAMES[$k]}" "SuperNode ID:" 300; done
  for _ in $(seq 1500); do grep -q "Failed to activate SuperNode" "$WORK/logs/node-unregistered.log" && break; sleep 0.2; done
  grep -q "Failed to activate SuperNode" "$WORK/logs/node-unregistered.log" \
    || fail "refused: the unregistered SuperNode did not report a refused activation"
  pid=$(cat "$WORK/logs/node-unregistered.pid")
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && fail "refused: the unregistered SuperNode is still running"
  online_nodes e2e >/dev/null
  strangers=$(json_get "$WORK/supernodes-e2e.json" "sorted(str(n['node-id']) for n in d['nodes'] if str(n.get('status','')).lower() == 'online' and str(n['node-id']) not in '${ID[*]}'.split())")
  [ "$strangers" = "[]" ] || fail "refused: SuperNodes online that were never registered: $strangers"
  log "refused: the unregistered SuperNode was refused; the 7 registered ones activated, no other is online"
}

# keys: node-0 … node-3 are clients 0-3; 4 node-frozen, 5 node-killed, 6 node-own; 7 is never
# registered
NAMES=(node-0 node-1 node-2 node-3 node-frozen node-killed node-own node-unregistered)
PARTS=(0 1 2 3 1 2 1 2)
declare -A ID=()
pids=()
for k in 0 1 2 3 4 5 6; do register e2e "node-$k" >"$WORK/id-$k" & pids+=("$!"); done
together "${pids[@]}"
for k in 0 1 2 3 4 5 6; do ID[${NAMES[$k]}]=$(cat "$WORK/id-$k"); done
for k in 0 1 2 3 4 5 6 7; do
  data=""
  [ "${NAMES[$k]}" = node-own ] && data=" dataset='npz:path=$WORK/own.npz:classes=10:mean=0.3:std=0.38'"
  start "${NAMES[$k]}" 1800 flower-supernode --superlink "127.0.0.1:$PORT" \
    --root-certificates "$WORK/certs/ca.crt" --auth-supernode-private-key "$WORK/certs/node-$k" \
    --port $((PORT + 1 + k)) \
    --node-config "partition-id=${PARTS[$k]} cache-dir='$WORK/cache-${NAMES[$k]}'$data"
done
log "7 keys registered (node ids ${ID[*]}); 8 SuperNodes starting"

binding() {  # binding NODE...: "ID=CLIENT ..." with the nodes as clients 0, 1, …
  local i=0 out="" node
  for node in "$@"; do out+="${ID[$node]}=$i "; i=$((i + 1)); done
  echo "node-clients='${out% }'"
}

# flower_check NAME: require finished:completed, compare with the local simulation, log the bytes.
flower_check() {
  local name=$1 status
  for _ in $(seq $((RUN_TIMEOUT * 5))); do [ -f "$WORK/local-$name.rc" ] && break; sleep 0.2; done
  [ "$(cat "$WORK/local-$name.rc" 2>/dev/null)" = 0 ] || fail "the local simulation $name failed (log: $WORK/logs/local-$name.log)"
  status=$(cat "$WORK/$name-status")
  [ "$status" = "finished:completed" ] || fail "$name: run ended '$status'; $(why "$name")"
  "$BIN/oneshotfl" compare "$WORK/local-$name/result.json" "$WORK/$name/result.json" >"$WORK/logs/$name-compare.log" \
    || fail "$name: the result differs from the local simulation ($(cat "$WORK/logs/$name-compare.log"))"
  log "$name: equal to the local simulation ($(tail -n 1 "$WORK/logs/$name-compare.log"))"
  log "$name: bytes on the wire (flwr ls): $(json_get "$WORK/$name-ls.json" "d['runs'][0]['network-traffic']")"
  log "$name: bytes we counted (uploads + downloads): $(json_get "$WORK/$name/result.json" \
    "sum(sum(m['upload_bytes_per_client']) + m['download_bytes_per_client'] * d['config']['clients'] for m in d['methods'])")"
}

check_main() {
  local edges
  submit main e2e "config='$WORK/main.yaml' $(binding node-0 node-1 node-2) node-timeout=300.0 $TIMEOUTS"
  flower_check main
  edges=$(json_get "$WORK/main/result.json" "sorted((s, r) for m in d['methods'] if 'topology' in m for s, r, _ in m['topology']['edges'])")
  [ "$edges" = "[(0, 1), (1, 2), (2, 0)]" ] || fail "relay: expected the directed ring's 3 edges, got $edges"
  log "relay: peer_ensemble crossed exactly the edges of the directed ring: $edges"
}

check_ring() {
  local same pairs
  submit ring e2e "config='$WORK/ring.yaml' $(binding node-0 node-1 node-2 node-3) node-timeout=300.0 $TIMEOUTS"
  flower_check ring
  same=$(json_get "$WORK/ring/result.json" "d['methods'][0]['client_personal_accuracy']")
  [ "$same" = "$(json_get "$WORK/local-ring/result.json" "d['methods'][0]['client_personal_accuracy']")" ] \
    || fail "ring: per-client results differ from the local simulation"
  pairs=$(json_get "$WORK/ring/result.json" "sorted((s, r) for s, r, _ in d['methods'][0]['topology']['edges'])")
  [ "$pairs" = "[(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (2, 3), (3, 0), (3, 2)]" ] \
    || fail "ring: expected the ring's 8 directed edges, got $pairs"
  log "ring: FOL per-client personal accuracy equals the local simulation: $same"
  log "ring: bytes per edge (sender, receiver, bytes): $(json_get "$WORK/ring/result.json" "sorted(tuple(e) for e in d['methods'][0]['topology']['edges'])")"
}

check_bad() {
  local used refused i attacks="garbage+oversize:mib=8+wrong_arch:arch=cnn" r="$WORK/bad/result.json"
  submit bad e2e "config='$WORK/ring.yaml' $(binding node-0 node-1 node-2 node-3) overrides='methods=fedavg min_clients=1 malicious=3 attack=$attacks cache_dir=$WORK/cache-bad' node-timeout=300.0 $TIMEOUTS"
  [ "$(cat "$WORK/bad-status")" = "finished:completed" ] || fail "bad: run ended $(cat "$WORK/bad-status"); $(why bad)"
  used=$(json_get "$r" "d['methods'][0]['clients_used']")
  [ "$used" = "[3]" ] || fail "bad: expected client 3 alone aggregated, got $used"
  for i in 0 1 2; do
    refused=$(json_get "$r" "d['methods'][0]['rejected'].get('$i', '')")
    case "$refused" in "client $i: "*) ;; *) fail "bad: expected client $i refused and named, got '$refused'" ;; esac
    log "bad: node $i ($(json_get "$r" "d['clients'][$i]['malicious']")) refused: $refused"
  done
  log "bad: aggregated clients $used"
}

check_bind() {
  local r="$WORK/bind/result.json" used refused addressed row
  submit bind e2e "config='$WORK/four.yaml' $(binding node-0 node-own node-3) overrides='min_clients=2 max_client_examples=900 cache_dir=$WORK/cache-bind' node-timeout=300.0 $TIMEOUTS"
  [ "$(cat "$WORK/bind-status")" = "finished:completed" ] || fail "bind: run ended $(cat "$WORK/bind-status"); $(why bind)"
  used=$(json_get "$r" "d['methods'][0]['clients_used']")
  refused=$(json_get "$r" "[w for w in d['methods'][0]['no_reply'].values() if 'binds it to client 2' in w]")
  addressed=$(json_get "$r" "sorted(d['flower']['node_clients'].values())")
  row=$(json_get "$r" "(d['clients'][1]['train_size'], [c for c, n in enumerate(d['clients'][1]['label_histogram']) if n])")
  [ "$used" = "[0, 1]" ] || fail "bind: expected clients [0, 1] aggregated, got $used"
  [ "$refused" != "[]" ] || fail "bind: expected node-3's claim refused and named, got $(json_get "$r" "d['methods'][0]['no_reply']")"
  [ "$addressed" = "[0, 1]" ] || fail "bind: expected only the bound nodes of clients 0 and 1 to answer, got $addressed"
  [ "$row" = "(40, [1, 4])" ] || fail "bind: expected client 1 booked as node-own reported (40 examples of classes 1 and 4), got $row"
  log "bind: node-3 (bound to client 2) claimed client 3 and was refused: $refused"
  log "bind: node-own brought its own npz; the server booked (examples, classes) = $row"
}

STAGE_CONFIG="config='$WORK/four.yaml' $(binding node-0 node-frozen node-killed node-3)"
STAGE_OVERRIDES=""
STAGE_TIMEOUTS="reply-timeout=$FAULT_REPLY.0"
log "main, ring, bad, bind, refused and the faults (with the quorum) side by side on the same nodes"
checks=()
for c in main ring bad bind refused; do "check_$c" & checks+=("$!"); done
QUORUM_TOO=1 FAULT_METHODS=fedavg faults e2e 4 node-frozen node-killed & checks+=("$!")
together "${checks[@]}"
kill_group node-frozen
kill_group node-killed

# the restart on two clients: its property does not depend on how many
STAGE_CONFIG="config='$WORK/four.yaml' $(binding node-0 node-1)"
STAGE_OVERRIDES="clients=2"
restart e2e 2 link_up
lost e2e link_up "$(cat "$WORK/restart-id")"
# each message a SuperNode takes starts a ClientApp process: the script's cost follows them
counts=""
for k in 0 1 2 3 4 5 6; do counts+=" ${NAMES[$k]} $(grep -c "Receiving: train" "$WORK/logs/${NAMES[$k]}.log" || true),"; done
log "messages the SuperNodes took (one ClientApp process each):${counts%,}"
log "PASSED: one TLS + node-auth deployment: main, ring, bad, bind, refused, faults, quorum, restart and lost state"
