#!/usr/bin/env bash
# A Flower deployment under faults, at scale, on loopback (127.0.0.1 only).
#
#   scripts/flower_chaos.sh            # 50 SuperNodes (CHAOS_NODES to change)
#   CHAOS_NODES=4 CHAOS_STAGES="faults restart" scripts/flower_chaos.sh   # make test's lane
#
# One SuperLink with TLS and CLI-managed SuperNode authentication (every node's key
# registered), persisting its state (`--database`), and CHAOS_NODES SuperNodes, each the client
# of its partition. Then:
#
#   faults   fedavg and ensemble while three nodes misbehave at once: node 0 sends garbage
#            bytes (the run's `attack=garbage`), node 1 is frozen (SIGSTOP) for longer than the
#            round's reply timeout, node 2 is killed (SIGKILL) once its ClientApp is at work on
#            its reply. The quorum is every other node (min_clients = N - 3): the run must
#            complete with exactly the other N - 3 clients, client 0 refused and named with
#            its reason, nodes 1 and 2 named among those that did not reply;
#   quorum   fedavg with min_clients = N (node 2 still dead, node 1 back): below the
#            quorum the run must end failed, its result written and the quorum named. With
#            the quorum check broken (a build that aggregates whatever arrived), this check
#            fails: the script is shown to be able to fail;
#   restart  local, fedavg and ensemble; the SuperLink is killed (SIGKILL) once the first
#            method's result is written (`partial.json`) and started again on its database.
#            Either the run resumes and completes, or it ends failed with every finished
#            method's result written and the reason named; never a hang (each wait has a
#            deadline). The SuperLink is killed with its process group (its SuperExec and the
#            ServerApp it started), as a crash of its machine would. What Flower did is printed. Then the SuperLink is started again without
#            its database (its state lost): it must answer at once that it does not know the run.
#
# Every SuperNode lives on this one host, and each instruction starts a ClientApp process on
# its node (a Python process importing torch, ~0.5 GB): the runs bound how many instructions
# are outstanding at once (the run config's `in-flight`, CHAOS_IN_FLIGHT), as a machine per
# node would not need. The SuperNodes run at a lower priority (nice 10) than the SuperLink:
# on a machine with fewer cores than nodes, their ClientApps would otherwise starve the
# SuperLink, whose SQLite state then times out on locks (seen at 20 nodes on two cores with
# every instruction out at once: every heartbeat refused, every node declared unavailable).
# The machine's peak memory in use (MemTotal - MemAvailable) is printed at the end.
# Exits non-zero on any failure, with the tail of the logs. Environment knobs: PYTHON_BIN
# (default .venv/bin), CHAOS_PORT (first of CHAOS_NODES + 8 ports, default 19580),
# CHAOS_NODES (default 50, at least 4), CHAOS_STAGES (default "faults quorum restart lost";
# quorum needs faults before it), CHAOS_IN_FLIGHT (default 8; 0 = every instruction at once),
# CHAOS_TIMEOUT (seconds per run, default 900), CHAOS_REPLY (the runs' reply timeout, default
# 120), KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PYTHON_BIN:-$PWD/.venv/bin}
PORT=${CHAOS_PORT:-19580}
N=${CHAOS_NODES:-50}
RUN_TIMEOUT=${CHAOS_TIMEOUT:-900}
REPLY=${CHAOS_REPLY:-120}
IN_FLIGHT=${CHAOS_IN_FLIGHT:-8}
STAGES=" ${CHAOS_STAGES:-faults quorum restart lost} "
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oneshotfl-flower-chaos.XXXXXX")
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS=1 ONESHOTFL_SHARED_DATA="$WORK/shared"
LINK=127.0.0.1:$PORT

log() { echo "flower-chaos: [${SECONDS}s] $*" >&2; }
fail() { log "FAILED: $*"; echo "$*" >>"$WORK/failures"; exit 1; }

kill_tree() {  # kill_tree SIGNAL PID: PID's process group
  kill "-$1" -- "-$2" 2>/dev/null || true
}

stage() { case "$STAGES" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

peak_used() {  # the machine's peak memory in use since the start, in GiB
  "$BIN/python" -c "print(f'{int(open(\"$WORK/peak-kib\").read()) / 2**20:.1f}')" 2>/dev/null || echo "?"
}

cleanup() {
  local rc=$? f
  [ -n "${SAMPLER:-}" ] && kill "$SAMPLER" 2>/dev/null
  for f in "$WORK"/logs/*.pid; do [ -f "$f" ] && kill_tree CONT "$(cat "$f")" && kill_tree KILL "$(cat "$f")"; done
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK"/logs/link*.log "$WORK"/logs/*-submit.log; do
      [ -f "$f" ] && { log "--- tail of $f"; tail -n 30 "$f" >&2; }
    done
    [ -f "$WORK/failures" ] && while read -r line; do log "FAILED: $line"; done <"$WORK/failures"
  fi
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

start() {  # start NAME CMD...: in its own process group; its PID in $WORK/logs/NAME.pid
  local name=$1
  shift
  setsid timeout -k 5 7200 "$@" >>"$WORK/logs/$name.log" 2>&1 &
  echo "$!" >"$WORK/logs/$name.pid"
  disown "$!"  # killed on purpose: no job notice
}

json_get() { "$BIN/python" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

wait_port() {
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  fail "nothing listens on 127.0.0.1:$1"
}

superlink() {
  start link flower-superlink --disable-runtime-dependency-installation \
    --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
    --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
    --host 127.0.0.1 --port "$PORT" --database "$WORK/link.db"
  wait_port "$PORT"
}

online() {  # how many SuperNodes the SuperLink lists as online
  timeout 120 "$BIN/flwr" supernode ls chaos --format json >"$WORK/nodes.json" 2>>"$WORK/logs/ls.log" || { echo 0; return; }
  json_get "$WORK/nodes.json" "sum(1 for n in d['nodes'] if str(n.get('status','')).lower() == 'online')"
}

# status RUN-ID: the run's status from `flwr ls`: "lost" when the SuperLink answers that it
# does not know the run (its state was lost), "" when it does not answer
status() {
  timeout 120 "$BIN/flwr" ls chaos --run-id "$1" --format json >"$WORK/ls.json" 2>>"$WORK/logs/ls.log" \
    && json_get "$WORK/ls.json" "d['runs'][0]['status'] if d.get('success') else ('lost' if 'not found' in d.get('error-message', '') else '')" 2>/dev/null \
    || echo ""
}

# why NAME: what the run's result.json (or partial.json) says of its failed methods and of the
# nodes that did not reply, in one line ("no result written" when there is none)
why() {
  local f
  for f in "$WORK/$1/result.json" "$WORK/$1/partial.json"; do
    [ -f "$f" ] && { json_get "$f" "'failed:', d.get('failed_methods'), 'no reply:', (d.get('flower') or {}).get('no_reply')" 2>/dev/null | cut -c1-900; return 0; }
  done
  echo "no result written"
}

# submit NAME "run config": submit, wait for the end (CHAOS_TIMEOUT), status → $WORK/NAME-status
submit() {
  local name=$1 id st="" deadline
  "$BIN/flwr" run "$WORK/app" chaos --format json --run-config "$2" >"$WORK/$name-submit.json" \
    2>>"$WORK/logs/$name-submit.log" || fail "$name: flwr run failed"
  id=$(json_get "$WORK/$name-submit.json" "d['run-id']")
  echo "$id" >"$WORK/$name-id"
  log "$name: run $id submitted"
  deadline=$((SECONDS + RUN_TIMEOUT))
  while [ "$SECONDS" -lt "$deadline" ]; do
    st=$(status "$id")
    case "$st" in finished:*) echo "$st" >"$WORK/$name-status"; return 0 ;; esac
    sleep 3
  done
  fail "$name: run $id still '$st' after ${RUN_TIMEOUT}s"
}

mkdir -p "$WORK/logs" "$FLWR_HOME"
[ "$N" -ge 4 ] || fail "CHAOS_NODES: expected at least 4 (three misbehave), got $N"
for s in $STAGES; do
  case "$s" in faults | quorum | restart | lost) ;; *) fail "CHAOS_STAGES: unknown stage '$s' (faults quorum restart lost)" ;; esac
done
if stage quorum && ! stage faults; then fail "CHAOS_STAGES: quorum needs faults (node 2 dead) before it"; fi
if stage lost && ! stage faults && ! stage restart; then fail "CHAOS_STAGES: lost needs a run before it (faults or restart)"; fi
( peak=0
  while :; do
    used=$(awk '/^MemTotal:/ {t=$2} /^MemAvailable:/ {a=$2} END {print t - a}' /proc/meminfo)
    [ "$used" -gt "$peak" ] && { peak=$used; echo "$peak" >"$WORK/peak-kib"; }
    sleep 1
  done ) &
SAMPLER=$!
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null \
  && fail "127.0.0.1:$PORT is in use (another SuperLink?): set CHAOS_PORT"
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null
"$BIN/oneshotfl" flower certs "$WORK/certs" --nodes "$N" >/dev/null
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "chaos"

[superlink.chaos]
address = "$LINK"
root-certificates = "$WORK/certs/ca.crt"
EOF
COMMON="dataset=digits clients=$N model=mlp local_epochs=1 local_steps=0 lr=0.05 min_samples=5 partition=iid"
WINDOW="in-flight=$IN_FLIGHT"

log "SuperLink with TLS and node auth on $LINK; registering $N node keys"
superlink
batch=()
for i in $(seq 0 $((N - 1))); do  # ten at a time
  timeout 120 "$BIN/flwr" supernode register "$WORK/certs/node-$i.pub" chaos --format json \
    >"$WORK/register-$i.json" 2>>"$WORK/logs/register.log" &
  batch+=("$!")
  if [ "${#batch[@]}" -eq 10 ] || [ "$i" -eq $((N - 1)) ]; then
    for pid in "${batch[@]}"; do wait "$pid" || true; done
    batch=()
  fi
done
for i in $(seq 0 $((N - 1))); do
  json_get "$WORK/register-$i.json" "d['node-id']" >/dev/null 2>&1 || fail "node-$i's key was not registered"
done
# SuperNodes start ten at a time, each batch online before the next. On two cores, 50 started
# at once were answered so slowly that some retried their activation after the SuperLink had
# already taken it, were refused ("could not be activated": it was online), and exited,
# while the SuperLink listed them online until their heartbeats ran out. A node whose
# process is gone once all are up is started again (the SuperLink takes it back once it has
# marked it offline).
node() {  # node I [NAME]: start SuperNode I
  start "${2:-node-$1}" nice -n 10 flower-supernode --superlink "$LINK" --root-certificates "$WORK/certs/ca.crt" \
    --auth-supernode-private-key "$WORK/certs/node-$1" --port $((PORT + 8 + $1)) \
    --node-config "partition-id=$1 num-partitions=$N cache-dir='$WORK/cache-$1'"
}
alive() { pgrep -g "$(cat "$WORK/logs/$1.pid")" -f flower-supernode >/dev/null; }
log "starting $N SuperNodes, ten at a time"
for i in $(seq 0 $((N - 1))); do
  node "$i"
  if [ $(((i + 1) % 10)) -eq 0 ] || [ "$i" -eq $((N - 1)) ]; then
    for _ in $(seq 60); do [ "$(online)" -ge $((i + 1)) ] && break; sleep 2; done
  fi
done
for attempt in 1 2 3; do
  dead=()
  for i in $(seq 0 $((N - 1))); do alive "node-$i" || dead+=("$i"); done
  [ "${#dead[@]}" -eq 0 ] && break
  log "SuperNodes ${dead[*]} exited while starting (activation refused); starting them again"
  sleep 60  # the SuperLink marks them offline once they miss their heartbeats
  for i in "${dead[@]}"; do node "$i" "node-$i-$attempt" && cp "$WORK/logs/node-$i-$attempt.pid" "$WORK/logs/node-$i.pid"; done
  sleep 10
done
for _ in $(seq 120); do [ "$(online)" -ge "$N" ] && break; sleep 2; done
[ "$(online)" -ge "$N" ] || fail "only $(online) of $N SuperNodes came online"
for i in $(seq 0 $((N - 1))); do alive "node-$i" || fail "SuperNode $i is not running"; done
log "$N SuperNodes online"

# --- faults: garbage, a frozen node, a node killed at work ------------------------------------
if stage faults; then
  node_pid() { cat "$WORK/logs/node-$1.pid"; }
  kill_tree STOP "$(node_pid 1)"
  log "faults: node 1 frozen (SIGSTOP); node 0 sends garbage; node 2 is killed once at work"
  submit faults "overrides='$COMMON methods=fedavg,ensemble min_clients=$((N - 3)) malicious=1 attack=garbage cache_dir=' out='$WORK/faults' node-timeout=120.0 reply-timeout=$REPLY.0 $WINDOW" &
  faults=$!
  for _ in $(seq $((RUN_TIMEOUT * 5))); do  # node 2's ClientApp appears when its instruction arrives (in-flight: maybe late)
    pgrep -g "$(node_pid 2)" -f flwr-clientapp >/dev/null && break
    sleep 0.2
  done
  pgrep -g "$(node_pid 2)" -f flwr-clientapp >/dev/null || fail "faults: node 2 never started its ClientApp"
  kill_tree KILL "$(node_pid 2)"
  log "faults: node 2 killed (SIGKILL) while its ClientApp was at work"
  wait "$faults" || fail "faults: the run did not end"
  kill_tree CONT "$(node_pid 1)"
  [ "$(cat "$WORK/faults-status")" = "finished:completed" ] \
    || fail "faults: run ended $(cat "$WORK/faults-status"); $(why faults)"
  R="$WORK/faults/result.json"
  want=$("$BIN/python" -c "print(list(range(3, $N)))")
  for m in 0 1; do
    used=$(json_get "$R" "d['methods'][$m]['clients_used']")
    [ "$used" = "$want" ] || fail "faults: $(json_get "$R" "d['methods'][$m]['key']") aggregated $used, expected clients 3..$((N - 1))"
  done
  refused=$(json_get "$R" "d['methods'][0]['rejected'].get('0', '')")
  case "$refused" in "client 0: "*) ;; *) fail "faults: expected client 0 refused and named, got '$refused'" ;; esac
  named=$(json_get "$R" "sorted(k for k in d['methods'][0]['no_reply'] if k.startswith('client '))")
  [ "$named" = "['client 1', 'client 2']" ] || fail "faults: expected clients 1 and 2 named as silent, got $named"
  log "faults: completed with clients 3..$((N - 1)); refused: $refused"
  log "faults: did not reply: $(json_get "$R" "{k: v[:90] for k, v in d['methods'][0]['no_reply'].items()}")"
fi

# --- quorum: below min_clients the run fails, its result written -----------------------------
if stage quorum; then
  submit quorum "overrides='$COMMON methods=fedavg min_clients=$N cache_dir=' out='$WORK/quorum' node-timeout=30.0 reply-timeout=$REPLY.0 $WINDOW"
  [ "$(cat "$WORK/quorum-status")" = "finished:failed" ] || fail "quorum: expected finished:failed with node 2 dead and min_clients=$N, got $(cat "$WORK/quorum-status")"
  why=$(json_get "$WORK/quorum/result.json" "d['failed_methods']['fedavg']")
  case "$why" in *"expected at least $N"*) ;; *) fail "quorum: expected the quorum named in result.json, got: $why" ;; esac
  log "quorum: failed as it must, result written: ${why:0:160}"
fi

# --- restart: the SuperLink killed mid-run and started again on its database ------------------
if stage restart; then
  # node 2 was killed: start it again. The SuperLink takes it back once it has given up on the
  # killed process (missed heartbeats), so the run waits at most 30 s for all N nodes, then
  # goes on with those connected.
  if stage faults; then node 2 node-2b; fi
  "$BIN/flwr" run "$WORK/app" chaos --format json --run-config "overrides='$COMMON methods=local,fedavg,ensemble min_clients=$((N - 3)) cache_dir=' out='$WORK/restart' node-timeout=30.0 reply-timeout=$REPLY.0 $WINDOW" \
    >"$WORK/restart-submit.json" 2>>"$WORK/logs/restart-submit.log" || fail "restart: flwr run failed"
  id=$(json_get "$WORK/restart-submit.json" "d['run-id']")
  echo "$id" >"$WORK/restart-id"
  log "restart: run $id submitted; waiting for its first method's result"
  for _ in $(seq 3000); do [ -f "$WORK/restart/partial.json" ] && break; sleep 0.2; done
  [ -f "$WORK/restart/partial.json" ] || fail "restart: no method finished before the deadline"
  kill_tree KILL "$(cat "$WORK/logs/link.pid")"  # the SuperLink and what it started (SuperExec, ServerApp)
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || break; sleep 0.2; done
  log "restart: SuperLink killed (SIGKILL, with its SuperExec and ServerApp) after $(json_get "$WORK/restart/partial.json" "[m['key'] for m in d['methods']]") finished"
  sleep 3
  superlink
  log "restart: SuperLink started again on $WORK/link.db"
  deadline=$((SECONDS + RUN_TIMEOUT))
  st=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    st=$(status "$id")
    case "$st" in finished:*) break ;; esac
    [ -f "$WORK/restart/result.json" ] && break
    sleep 3
  done
  if [ -f "$WORK/restart/result.json" ]; then
    for _ in $(seq 60); do case "$st" in finished:*) break ;; esac; sleep 2; st=$(status "$id"); done
    log "restart: the run resumed and ended '$st': methods $(json_get "$WORK/restart/result.json" "[m['key'] for m in d['methods']], 'failed:', d.get('failed_methods') or {}")"
    [ "$(json_get "$WORK/restart/result.json" "len(d['methods']) + len(d.get('failed_methods') or {})")" = 3 ] \
      || fail "restart: result.json lacks methods"
  else
    kept=$(json_get "$WORK/restart/partial.json" "[m['key'] for m in d['methods']]")
    [ "$kept" != "[]" ] || fail "restart: partial.json keeps no finished method"
    case "$st" in
      finished:*) log "restart: Flower ended the run '$st' ($(json_get "$WORK/ls.json" "d['runs'][0].get('status-details', '')")): its ServerApp went with the SuperLink; partial.json keeps $kept, pending $(json_get "$WORK/restart/partial.json" "d['partial']['pending']")" ;;
      *) fail "restart: run $id still '$st' after ${RUN_TIMEOUT}s (partial.json keeps $kept)" ;;
    esac
  fi
fi

# --- lost state: a SuperLink started again without its database does not know the run ---------
if stage lost; then
  id=$(cat "$WORK/restart-id" 2>/dev/null || cat "$WORK/faults-id")
  kill_tree KILL "$(cat "$WORK/logs/link.pid")"
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || break; sleep 0.2; done
  mv "$WORK/link.db" "$WORK/link-lost.db"
  superlink
  st=$(status "$id")
  [ "$st" = lost ] || fail "lost state: expected the new SuperLink to say it does not know run $id, got '$st'"
  log "lost state: a SuperLink without the old database answers at once that run $id is unknown: $(json_get "$WORK/ls.json" "d['error-message'].splitlines()[-1]")"
fi

log "PASSED: $N SuperNodes with TLS + node auth, at most $IN_FLIGHT instructions out at once; stages:$STAGES; peak memory in use $(peak_used) GiB"
