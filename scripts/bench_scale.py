"""What a run costs as one dataset is split over more clients (``make bench-scale``).

Reads ``benchmarks/scale.yaml``: for each run and client count it writes a config, runs
``oneshotfl run`` in a child process at one thread (``OMP_NUM_THREADS=1``) and records the
wall time, the child's peak resident memory (``getrusage`` of a wrapper process that runs only
that child) and, from ``result.json``, where the time went: client training (each method's
``client_wall_s`` and the shared client training), the clients' diagnostics
(``timings.client_diagnostics_s``), the server (``server_wall_s``) and evaluation
(``timings.evaluation_s``); the rest (loading and carving the data, the wire, writing) is
"other". A ``before`` entry runs the same command on the tree ``before_rev`` (checked out as
a git worktree under ``runs/``), right after its "after" run. Writes ``summary.json`` in
the spec's ``out`` folder (default ``benchmarks/results/scale``) and the table between the
spec's ``section`` markers (default ``scale``) of ``docs/benchmarks/scale.md``; a spec's
``ratios`` (pairs of client counts of one run) add, under the table, each tree's wall time at
the larger count over the smaller, both measured by the same command.

Usage: ``python scripts/bench_scale.py [benchmarks/scale.yaml] [--only NAME] [--max-clients N]
[--side after|before]``; rows already in ``summary.json`` are replaced as they are run again.
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from oneshotfl.runner.report import splice_markdown

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks/results/scale"  # a spec's `out` replaces it
DOC = ROOT / "docs/benchmarks/scale.md"
WRAP = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
    "print('peak_rss_kb', peak, file=sys.stderr); "
    "sys.exit(rc)"
)


def worktree(rev: str) -> Path:
    """A checkout of ``rev`` under runs/ (made once)."""
    path = ROOT / "runs" / f"before-{rev}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True)
    return path


def run_one(config: dict[str, Any], out: Path, limit: float, src: Path | None) -> dict[str, Any]:
    """One ``oneshotfl run`` in a child process; its wall time, peak memory and split."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    if src is not None:
        env["PYTHONPATH"] = str(src / "src")
    cmd = [sys.executable, "-c", WRAP, sys.executable, "-m", "oneshotfl", "run",
           "--config", str(out / "config.yaml"), "--out", str(out / "run")]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"status": f"did not end within {limit:.0f} s", "wall_s": None}
    wall = time.perf_counter() - start
    (out / "log.txt").write_text(done.stdout[-20000:] + done.stderr[-20000:])
    rss = [
        int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak_rss_kb")
    ]
    row: dict[str, Any] = {
        "status": "ok" if done.returncode == 0 else f"exit {done.returncode}",
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(rss[-1] / 1024) if rss else None,
    }
    result = out / "run" / "result.json"
    if result.exists():
        doc = json.loads(result.read_text())
        row.update(split(doc))
        row["accuracy"] = {m["key"]: round(m["accuracy"], 4) for m in doc["methods"]}
        row["environment"] = {k: doc["environment"].get(k) for k in ("cpu", "torch", "threads")}
        (out / "result.json").write_text(result.read_text())
    shutil.rmtree(out / "run", ignore_errors=True)  # its CSVs and plot: result.json says it all
    return row


def split(doc: dict[str, Any]) -> dict[str, Any]:
    """Where a run's time went (see the module docs); what it predates is ``None``."""
    methods = doc["methods"]
    own = sum(sum(m.get("client_own_s") or m["client_wall_s"]) for m in methods)
    entries = doc.get("shared_client_training", [])
    shared = sum(e.get("seconds_per_client", 0) for e in entries) * len(doc["clients"])
    timings = [m.get("timings") for m in methods]
    known = all(t is not None for t in timings)
    server = sum(m.get("server_wall_s", 0) + sum(m.get("receiver_wall_s") or []) for m in methods)
    out = {
        "client_training_s": round(own + shared, 1),
        "server_s": round(server, 1),
        "diagnostics_s": round(sum(t["client_diagnostics_s"] for t in timings), 1)
        if known
        else None,
        "evaluation_s": round(sum(t["evaluation_s"] for t in timings), 1) if known else None,
        "run_s": round(doc["wall_time_s"], 1),
    }
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", nargs="?", default=str(ROOT / "benchmarks/scale.yaml"))
    parser.add_argument("--only", default=None)
    parser.add_argument("--max-clients", type=int, default=None)
    parser.add_argument(
        "--side",
        choices=("after", "before"),
        default=None,
        help="run only this side (default: both where the spec has before)",
    )
    args = parser.parse_args(argv)
    spec = yaml.safe_load(Path(args.spec).read_text())
    out_dir = ROOT / spec.get("out", "benchmarks/results/scale")
    summary_path = out_dir / "summary.json"
    rows: list[dict[str, Any]] = (
        json.loads(summary_path.read_text()) if summary_path.exists() else []
    )
    for run in spec["runs"]:
        if args.only and run["name"] != args.only:
            continue
        for n in run["clients"]:
            if args.max_clients and n > args.max_clients:
                continue
            config = {
                **spec["base"],
                **run.get("settings", {}),
                "methods": run["methods"],
                "clients": n,
            }
            slug = f"{run['name'].replace(' ', '-')}-n{n}"
            sides = [("after", None)] + (
                [("before", worktree(spec["before_rev"]))] if n in run.get("before", []) else []
            )
            for side, src in sides:
                if args.side and side != args.side:
                    continue
                print(f"{run['name']} n={n} {side} …", flush=True)
                row = run_one(config, out_dir / f"{slug}-{side}", spec["limit_s"], src)
                row.update({"run": run["name"], "clients": n, "side": side})
                rows = [
                    r for r in rows if (r["run"], r["clients"], r["side"]) != (run["name"], n, side)
                ]
                rows.append(row)
                out_dir.mkdir(parents=True, exist_ok=True)
                summary_path.write_text(json.dumps(rows, indent=2) + "\n")
                print(
                    json.dumps({k: row.get(k) for k in ("status", "wall_s", "peak_rss_mb")}),
                    flush=True,
                )
    splice_markdown(DOC, spec.get("section", "scale"), table(rows, spec))


def _f(value: Any) -> str:
    return "—" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def table(rows: list[dict[str, Any]], spec: dict[str, Any]) -> str:
    """The markdown table of every recorded run, and the spec's ratios."""
    lines = [
        "| run | clients | tree | wall s | peak RSS MB | client training s | diagnostics s "
        "| server s | evaluation s | other s | not asked for | accuracy |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = {"after": 0, "before": 1}
    for r in sorted(rows, key=lambda r: (r["run"], r["clients"], order[r["side"]])):
        tree = "now" if r["side"] == "after" else f"before ({spec['before_rev']})"
        if r.get("status") != "ok":
            lines.append(
                f"| {r['run']} | {r['clients']} | {tree} | {r.get('status')} | | | | | | | | |"
            )
            continue
        parts = [
            r.get(k) for k in ("client_training_s", "diagnostics_s", "server_s", "evaluation_s")
        ]
        other = r["run_s"] - sum(p for p in parts if p is not None) if r.get("run_s") else None
        overhead = None
        if r.get("diagnostics_s") is not None and r.get("wall_s"):
            overhead = f"{100 * r['diagnostics_s'] / r['wall_s']:.0f}%"
        acc = ", ".join(
            f"{k.split(':')[0]} {100 * v:.1f}" for k, v in (r.get("accuracy") or {}).items()
        )
        lines.append(
            f"| {r['run']} | {r['clients']:,} | {tree} | {_f(r['wall_s'])} | "
            f"{_f(r.get('peak_rss_mb'))} | "
            f"{_f(parts[0])} | {_f(parts[1])} | {_f(parts[2])} | {_f(parts[3])} | "
            f"{_f(None if other is None else round(other, 1))} | {overhead or '—'} | {acc} |"
        )
    lines += ratio_lines(rows, spec)
    env = next((r.get("environment") for r in rows if r.get("environment")), {}) or {}
    lines += [
        "",
        f"Measured on {env.get('cpu')}, torch {env.get('torch')}, {env.get('threads')} thread(s).",
    ]
    return "\n".join(lines)


def ratio_lines(rows: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """For each of the spec's ``ratios`` (``{run, clients: [small, large]}``) and each tree,
    the wall time at the larger client count over the smaller."""
    wall = {(r["run"], r["clients"], r["side"]): r.get("wall_s") for r in rows}
    lines: list[str] = []
    for ratio in spec.get("ratios", []):
        small, large = ratio["clients"]
        for side in ("after", "before"):
            a, b = wall.get((ratio["run"], small, side)), wall.get((ratio["run"], large, side))
            if a and b:
                tree = "now" if side == "after" else f"before ({spec['before_rev']})"
                lines.append(
                    f"- {ratio['run']}, {tree}: {large:,} clients take {b / a:.2f}× the wall "
                    f"time of {small:,} ({b:g} s against {a:g} s)"
                )
    return ["", *lines] if lines else []


if __name__ == "__main__":
    main(sys.argv[1:])
