"""Where a run's time grows with its client count: the same run profiled at two counts.

Reads a scale spec (``benchmarks/scale-stream.yaml``) and its ``profiles`` entries
(``{run: NAME, clients: [small, large]}``): for each count it runs that run's config as
``python -m cProfile -m oneshotfl run`` in a child process at one thread, writes the top
functions by own time (``profile-n<N>.txt``), and then, function by function, the time the
larger run spends beyond the smaller one (own time, cProfile's ``tottime``), largest first,
with the share of the total growth and the calls per added client. Writes
``growth-<small>-<large>.json`` in the spec's ``out`` folder and the table between the
``<spec section>-growth`` markers of ``docs/benchmarks/scale.md``.

cProfile adds a cost per Python call, so the profiled runs are slower than the timed ones and
Python-heavy code weighs more in them: this says where the growth goes, the timed runs
(``scripts/bench_scale.py``) say how large it is.

Usage: ``python scripts/profile_growth.py [benchmarks/scale-stream.yaml]``. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import io
import json
import os
import pstats
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from oneshotfl.runner.report import splice_markdown

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/benchmarks/scale.md"
TOP = 25


def profile(config: dict[str, Any], out: Path, limit: float) -> pstats.Stats:
    """Run ``config`` under cProfile in a child process; its stats (and the top by own time
    written to ``out.txt``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    conf = out.with_suffix(".yaml")
    conf.write_text(yaml.safe_dump(config, sort_keys=False))
    prof = out.with_suffix(".prof")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    run_dir = out.parent / f"{out.name}-run"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "oneshotfl", "run",
           "--config", str(conf), "--out", str(run_dir)]  # fmt: skip
    subprocess.run(cmd, env=env, capture_output=True, check=True, timeout=limit)
    stats = pstats.Stats(str(prof))
    text = io.StringIO()
    pstats.Stats(str(prof), stream=text).sort_stats("tottime").print_stats(40)
    out.with_suffix(".txt").write_text(text.getvalue().replace(str(ROOT) + "/", ""))
    for path in (prof, conf):
        path.unlink()
    shutil.rmtree(run_dir, ignore_errors=True)
    return stats


def own_times(stats: pstats.Stats) -> dict[str, tuple[float, int]]:
    """Function → (own seconds, calls), keyed ``file:line(name)`` relative to the repo and
    the environment's site-packages."""
    out: dict[str, tuple[float, int]] = {}
    for (file, line, name), (_, calls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = file.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        out[f"{where}:{line}({name})"] = (tottime, calls)
    return out


def growth(small: pstats.Stats, large: pstats.Stats, added: int) -> dict[str, Any]:
    """Per function, the own time the larger run spends beyond the smaller, largest first."""
    a, b = own_times(small), own_times(large)
    rows: list[dict[str, Any]] = []
    for key in set(a) | set(b):
        (ta, ca), (tb, cb) = a.get(key, (0.0, 0)), b.get(key, (0.0, 0))
        rows.append({"function": key, "delta_s": tb - ta, "calls_per_client": (cb - ca) / added})
    rows.sort(key=lambda r: -float(r["delta_s"]))
    total = sum(t for t, _ in b.values()) - sum(t for t, _ in a.values())
    return {"total_delta_s": total, "top": rows[:TOP]}


def table(found: dict[str, Any], small: int, large: int) -> str:
    lines = [
        f"Profiled (`python scripts/profile_growth.py`, cProfile, one thread): {large:,} clients "
        f"spent {found['total_delta_s']:.1f} s more own time than {small:,} "
        f"({found['seconds'][str(small)]:.1f} s against {found['seconds'][str(large)]:.1f} s "
        "under the profiler). The functions that grew most:",
        "",
        "| function | own s added | share of the growth | calls per added client |",
        "|---|---:|---:|---:|",
    ]
    for r in found["top"]:
        share = 100 * r["delta_s"] / found["total_delta_s"]
        lines.append(
            f"| `{r['function']}` | {r['delta_s']:+.2f} | {share:.0f}% | "
            f"{r['calls_per_client']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    spec_path = Path(argv[0] if argv else ROOT / "benchmarks/scale-stream.yaml")
    spec = yaml.safe_load(spec_path.read_text())
    out_dir = ROOT / spec.get("out", "benchmarks/results/scale")
    runs = {r["name"]: r for r in spec["runs"]}
    for entry in spec.get("profiles", []):
        run = runs[entry["run"]]
        config = {**spec["base"], **run.get("settings", {}), "methods": run["methods"]}
        small, large = entry["clients"]
        stats, seconds = {}, {}
        for n in (small, large):
            print(f"profiling {entry['run']} at {n} clients …", flush=True)
            stats[n] = profile({**config, "clients": n}, out_dir / f"profile-n{n}", spec["limit_s"])
            seconds[str(n)] = stats[n].total_tt  # type: ignore[attr-defined]
        found = {**growth(stats[small], stats[large], large - small), "seconds": seconds}
        (out_dir / f"growth-{small}-{large}.json").write_text(json.dumps(found, indent=2) + "\n")
        text = table(found, small, large)
        splice_markdown(DOC, f"{spec.get('section', 'scale')}-growth", text)
        print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
