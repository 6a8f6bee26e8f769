#!/usr/bin/env bash
# Where a command's CPU goes, by kind of process (issue 50's profile of the Flower end-to-end
# script): runs COMMAND while sampling `ps` every SAMPLE seconds (default 2), then prints, per
# kind (Flower's ClientApp and ServerApp processes, SuperNodes, SuperLinks, SuperExecs, `flwr`
# CLI calls, local `oneshotfl` runs, anything else), how many processes were seen and the CPU
# seconds they had used when last seen, with the command's wall time and exit status. A sample
# misses what starts and ends between two samples and the CPU a process uses after its last
# one, so the figures are lower bounds. Run it on an otherwise idle machine.
#
#   scripts/cpu_by_process.sh bash scripts/flower_e2e.sh
set -uo pipefail
SAMPLE=${SAMPLE:-2}
samples=$(mktemp "${TMPDIR:-/tmp}/cpu-by-process.XXXXXX")
trap 'rm -f "$samples"' EXIT
start=$(date +%s)
"$@" &
cmd=$!
while kill -0 "$cmd" 2>/dev/null; do
  # pid, cumulative CPU seconds, command line: the processes started since COMMAND was
  # (their elapsed time no longer than its), but the sampler's own
  ps -eo pid=,etimes=,times=,args= | awk -v el=$(($(date +%s) - start + 1)) \
    '$2 <= el && !/cpu_by_process|ps -eo|awk -v el/ { $2 = ""; print }' >>"$samples"
  sleep "$SAMPLE"
done
wait "$cmd"
rc=$?
echo "# $* -> exit $rc in $(($(date +%s) - start)) s; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
awk '
  { pid = $1; t = $2; $1 = $2 = ""; if (!(pid in cpu) || t + 0 > cpu[pid] + 0) { cpu[pid] = t; args[pid] = $0 } }
  END {
    for (p in cpu) {
      a = args[p]; k = "other"
      if (a ~ /flwr-clientapp/) k = "ClientApp processes"
      else if (a ~ /flwr-serverapp/) k = "ServerApp processes"
      else if (a ~ /flower-supernode|\[flower-supernod/) k = "SuperNodes"
      else if (a ~ /flower-superlink|\[flower-superlin/) k = "SuperLinks"
      else if (a ~ /flower-superexec|\[flower-superexe/) k = "SuperExecs"
      else if (a ~ /bin\/flwr /) k = "flwr CLI calls"
      else if (a ~ /bin\/oneshotfl /) k = "oneshotfl commands (local runs, compare)"
      n[k]++; s[k] += cpu[p]; total += cpu[p]
    }
    for (k in s) printf "%09.0f\t%-42s %4d processes %7.0f CPU s\n", s[k], k, n[k], s[k]
    printf "-1\t%-42s %4s %17.0f CPU s\n", "all", "", total
  }' "$samples" | sort -t$'\t' -k1,1nr | cut -f2-
exit "$rc"
