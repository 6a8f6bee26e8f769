"""Where a command's CPU goes: run it, and account the machine's busy CPU-seconds to processes.

    python scripts/cpu_account.py OUT.json -- CMD [ARG...]

Reads ``/proc/stat`` before and after (every process on the machine, so run it alone), and
samples ``/proc/PID/stat`` every 0.3 s to give each process that ran meanwhile its user + system
CPU-seconds (for one that was already running, only what it used meanwhile), grouped by what
it is (a Flower ClientApp, a ServerApp, a SuperNode, pytest's workers, mypy, ...). A process
that starts and ends between two samples is missed, so the groups add up to a little less than
the busy total. Writes OUT.json (wall, busy CPU-seconds, the CPU, each group's processes and
CPU-seconds) and prints a table; exits with the command's status. Linux only. It replaces
``scripts/cpu_by_process.sh`` (``ps`` samples every 2 s, no busy total, last at f71c361).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
GROUPS = (  # the first pattern a command line contains names its group
    ("flwr-clientapp", "Flower ClientApp"),
    ("flwr-serverapp", "Flower ServerApp"),
    ("flower-superexec", "Flower SuperExec"),
    ("flower-superlink", "Flower SuperLink"),
    ("flower-supernode", "Flower SuperNode"),
    ("flwr ", "flwr command"),
    ("oneshotfl run", "oneshotfl run (local simulation)"),
    ("oneshotfl ", "oneshotfl command"),
    ("pytest", "pytest and its workers"),
    ("exec(eval(sys.stdin.readline()))", "pytest and its workers"),  # xdist's workers
    ("mypy", "mypy"),
    ("ruff", "ruff"),
    ("mkdocs", "mkdocs"),
)


def busy_ticks() -> int:
    """The machine's busy ticks so far (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return user + nice + system + irq + softirq


def snapshot() -> dict[tuple[str, str], tuple[str, float]]:
    """(pid, start time) -> (command line, CPU-seconds so far) for every process."""
    out: dict[tuple[str, str], tuple[str, float]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[(pid, fields[19])] = (cmd.strip(), (int(fields[11]) + int(fields[12])) / TICK)
    return out


def group(cmd: str) -> str:
    for pattern, name in GROUPS:
        if pattern in cmd:
            return name
    return "other" if cmd else "kernel or exited unseen"


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: python scripts/cpu_account.py OUT.json -- CMD [ARG...]")
    out, cmd = Path(sys.argv[1]), sys.argv[3:]
    first = snapshot()
    seen: dict[tuple[str, str], tuple[str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for key, (line, cpu) in snapshot().items():
                old = seen.get(key, ("", 0.0))
                seen[key] = (line or old[0], max(cpu, old[1]))
            time.sleep(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    b0, t0 = busy_ticks(), time.monotonic()
    sampler.start()
    rc = subprocess.call(cmd)
    wall, busy = time.monotonic() - t0, (busy_ticks() - b0) / TICK
    done.set()
    sampler.join()
    me = str(os.getpid())
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for key, (line, cpu) in seen.items():
        used = cpu - first.get(key, ("", 0.0))[1]
        if key[0] != me and used > 0:
            groups[group(line)][0] += 1
            groups[group(line)][1] += used
    rows = sorted(((g, int(n), round(c, 1)) for g, (n, c) in groups.items()), key=lambda r: -r[2])
    own = os.times()
    rows.append(("this accounting's sampling", 1, round(own.user + own.system, 1)))
    import torch  # after the measurement: it takes seconds of CPU

    from oneshotfl.environment import cpu_id, cpu_model

    doc = {"command": cmd, "exit": rc, "wall_s": round(wall, 1), "busy_cpu_s": round(busy, 1),
           "cores": os.cpu_count(), "cpu": cpu_model(), "cpu_id": cpu_id(),
           "python": platform.python_version(), "torch": torch.__version__,
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "groups": [{"group": g, "processes": n, "cpu_s": c} for g, n, c in rows]}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    cores = os.cpu_count()
    print(f"{' '.join(cmd)}: exit {rc}, {wall:.0f} s wall, {busy:.0f} busy CPU-s on {cores} cores")
    for g, n, c in rows:
        print(f"  {g:36s} {n:4d} processes {c:8.1f} CPU-s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
