#!/usr/bin/env bash
# A Flower deployment under faults, at scale, on loopback (127.0.0.1 only).
#
#   scripts/flower_chaos.sh            # 50 SuperNodes (CHAOS_NODES to change)
#   CHAOS_NODES=4 CHAOS_STAGES="faults restart" scripts/flower_chaos.sh   # a small lane
#
# One SuperLink with TLS and CLI-managed SuperNode authentication (every node's key
# registered), persisting its state (`--database`), and CHAOS_NODES SuperNodes, each the client
# of its partition. Then:
#
#   faults   fedavg and ensemble while three nodes misbehave at once: node 0 sends garbage
#            bytes (the run's `attack=garbage`), node 1 is frozen (SIGSTOP) for the whole run
#            (the SuperLink declares it unavailable once it misses its heartbeats, or the
#            round's reply timeout passes), node 2 is killed (SIGKILL) once its ClientApp is at
#            work on its reply. The quorum is every other node (min_clients = N - 3): the run must
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
#            ServerApp it started), as a crash of its machine would. What Flower did is
#            printed;
#   lost     the SuperLink is started again without its database (its state lost): it must
#            answer at once that it does not know the run.
#
# The stages are scripts/flower_lib.sh's, which `make test`'s end-to-end script
# (scripts/flower_e2e.sh) also runs, on its one deployment of 4 clients.
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
TAG=flower-chaos
export PATH="$BIN:$PATH" FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0 \
  FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS=1 ONESHOTFL_SHARED_DATA="$WORK/shared"
# shellcheck source=scripts/flower_lib.sh
source scripts/flower_lib.sh
LINK=127.0.0.1:$PORT
LINK_PORT=$PORT

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
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else remove_work; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

superlink() {
  start link 7200 flower-superlink --disable-runtime-dependency-installation \
    --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
    --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
    --host 127.0.0.1 --port "$PORT" --database "$WORK/link.db"
  disown "$!"  # killed on purpose: no job notice
  wait_port "$PORT"
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
listening "$PORT" && fail "127.0.0.1:$PORT is in use (another SuperLink?): set CHAOS_PORT"
"$BIN/oneshotfl" flower app-dir "$WORK/app" >/dev/null
"$BIN/oneshotfl" flower certs "$WORK/certs" --nodes "$N" >/dev/null
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "chaos"

[superlink.chaos]
address = "$LINK"
root-certificates = "$WORK/certs/ca.crt"
EOF
STAGE_CONFIG=""
STAGE_OVERRIDES="dataset=digits clients=$N model=mlp local_epochs=1 local_steps=0 lr=0.05 min_samples=5 partition=iid"
STAGE_TIMEOUTS="reply-timeout=$REPLY.0 in-flight=$IN_FLIGHT"

log "SuperLink with TLS and node auth on $LINK; registering $N node keys"
superlink
batch=()
for i in $(seq 0 $((N - 1))); do  # ten at a time
  (register chaos "node-$i" >/dev/null) &
  batch+=("$!")
  if [ "${#batch[@]}" -eq 10 ] || [ "$i" -eq $((N - 1)) ]; then
    together "${batch[@]}"
    batch=()
  fi
done
# SuperNodes start ten at a time, each batch online before the next. On two cores, 50 started
# at once were answered so slowly that some retried their activation after the SuperLink had
# already taken it, were refused ("could not be activated": it was online), and exited,
# while the SuperLink listed them online until their heartbeats ran out. A node whose
# process is gone once all are up is started again (the SuperLink takes it back once it has
# marked it offline).
node() {  # node I [NAME]: start SuperNode I
  start "${2:-node-$1}" 7200 nice -n 10 flower-supernode --superlink "$LINK" --root-certificates "$WORK/certs/ca.crt" \
    --auth-supernode-private-key "$WORK/certs/node-$1" --port $((PORT + 8 + $1)) \
    --node-config "partition-id=$1 num-partitions=$N cache-dir='$WORK/cache-$1'"
  disown "$!"
}
alive() { pgrep -g "$(cat "$WORK/logs/$1.pid")" -f flower-supernode >/dev/null; }
log "starting $N SuperNodes, ten at a time"
for i in $(seq 0 $((N - 1))); do
  node "$i"
  if [ $(((i + 1) % 10)) -eq 0 ] || [ "$i" -eq $((N - 1)) ]; then
    wait_online chaos $((i + 1)) 120 >/dev/null
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
online=$(wait_online chaos "$N" 240)
[ "$online" -ge "$N" ] || fail "only $online of $N SuperNodes came online"
for i in $(seq 0 $((N - 1))); do alive "node-$i" || fail "SuperNode $i is not running"; done
log "$N SuperNodes online"

if stage faults; then
  faults chaos "$N" node-1 node-2
  kill_tree CONT "$(cat "$WORK/logs/node-1.pid")"
fi
if stage quorum; then quorum_check chaos "$N"; fi
if stage restart; then
  # node 2 was killed: start it again. The SuperLink takes it back once it has given up on the
  # killed process (missed heartbeats), so the run waits at most 30 s for all N nodes, then
  # goes on with those connected.
  if stage faults; then node 2 node-2b; fi
  restart chaos "$N" superlink
fi
if stage lost; then lost chaos superlink "$(cat "$WORK/restart-id" 2>/dev/null || cat "$WORK/faults-id")"; fi

log "PASSED: $N SuperNodes with TLS + node auth, at most $IN_FLIGHT instructions out at once; stages:$STAGES; peak memory in use $(peak_used) GiB"
