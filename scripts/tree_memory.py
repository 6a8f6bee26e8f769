"""Peak memory of a process tree, sampled: resident (RSS) and proportional (PSS) sets.

    python scripts/tree_memory.py OUT.json --pid PID      # watch PID's tree until it exits
    python scripts/tree_memory.py OUT.json -- CMD ARG...  # run CMD, watch its tree
    python scripts/tree_memory.py OUT.json --pid PID --also PID2 --also PID3
                                   # PID's tree and the trees of PID2, PID3 (e.g. the Ray
                                   # nodes of a cluster), until PID exits

Every ``--every`` seconds (default 0.5) it sums, over the root and all its descendants, the
resident set (``/proc/PID/status`` VmRSS) and the proportional set (``/proc/PID/smaps_rollup``
Pss: a page shared by k processes counts 1/k in each, so a memory-mapped dataset that k Ray
workers read counts once). Summed RSS counts every shared page once per process (torch's
libraries, a shared file): it overstates a tree of many Python processes; PSS is what the
tree holds. Writes ``OUT.json``: the peaks of both sums, the process count at the PSS peak
and the ten largest processes then (command, RSS and PSS in MiB), and the command's exit
status and wall seconds. With ``--`` it exits with the command's status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def children_table() -> dict[int, list[int]]:
    """Parent pid → child pids, from /proc."""
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        table.setdefault(ppid, []).append(int(entry))
    return table


def tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    table, out, todo = children_table(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += table.get(pid, [])
    return out


def kib(path: str, field: str) -> int:
    """A ``field: N kB`` line of a /proc file (0 when gone)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"
    words = [w for w in raw.split() if not w.endswith(("python", "python3", "python3.11"))]
    return " ".join(words)[:90]


def running(pid: int) -> bool:
    """Whether ``pid`` is alive (a zombie is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def watch(
    root: int,
    every: float,
    proc: subprocess.Popen[bytes] | None = None,
    out: Path | None = None,
    also: tuple[int, ...] = (),
) -> dict[str, object]:
    """Sample the trees of ``root`` and ``also`` until ``root`` exits; the peaks (written to
    ``out`` as they change, so a reader that stops the tree first still finds them)."""
    peak_rss = peak_pss = 0
    record: dict[str, object] = {}
    at_peak: list[dict[str, object]] = []
    processes = 0
    while (proc.poll() is None) if proc is not None else running(root):
        rows = []
        for pid in dict.fromkeys(p for r in (root, *also) for p in tree(r)):
            rss, pss = kib(f"/proc/{pid}/status", "VmRSS"), kib(f"/proc/{pid}/smaps_rollup", "Pss")
            rows.append((pid, rss, pss))
        rss_sum, pss_sum = sum(r for _, r, _ in rows), sum(p for _, _, p in rows)
        peak_rss = max(peak_rss, rss_sum)
        if pss_sum > peak_pss:
            peak_pss, processes = pss_sum, len(rows)
            top = sorted(rows, key=lambda r: -r[2])[:10]
            at_peak = [
                {"command": command(p), "rss_mib": r // 1024, "pss_mib": s // 1024}
                for p, r, s in top
            ]
        record = {
            "peak_rss_sum_mib": peak_rss // 1024,
            "peak_pss_sum_mib": peak_pss // 1024,
            "processes_at_peak": processes,
            "largest_at_peak": at_peak,
        }
        if out is not None and (rss_sum == peak_rss or pss_sum == peak_pss):
            out.write_text(json.dumps(record, indent=2) + "\n")
        time.sleep(every)
    return record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pid", type=int)
    parser.add_argument("--also", type=int, action="append", default=[])
    parser.add_argument("--every", type=float, default=0.5)
    split = argv.index("--") if "--" in argv else len(argv)
    args, cmd = parser.parse_args(argv[:split]), argv[split + 1 :]
    if (args.pid is None) == (not cmd):
        parser.error("give either --pid PID or -- CMD ARG...")
    start, rc = time.perf_counter(), None
    if cmd:
        proc = subprocess.Popen(cmd)
        record = watch(proc.pid, args.every, proc, args.out, tuple(args.also))
        rc = proc.wait()
    else:
        record = watch(args.pid, args.every, None, args.out, tuple(args.also))
    record |= {"wall_s": round(time.perf_counter() - start, 1), "exit_status": rc}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if rc is None else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
