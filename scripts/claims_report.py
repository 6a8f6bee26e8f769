"""The seed papers' headline claims against our committed results (issue 43).

``benchmarks/claims.yaml`` lists, per claim, the paper's number and the settings of ours that
come nearest: for each setting a method ``a`` of a committed sweep and what it is compared with
(``b``: one method, or ``best_of`` several, the best on the mean; ``b_cell`` and
``b_bench`` where it ran in another cell or sweep). This script reads the
``result.json`` files, computes our difference (percentage points, mean ± std over seeds), and
a verdict by one rule for every row:

* ``beats`` (the paper's margin per setting): a setting *holds* where our margin is at least
  half the paper's, *in direction* where it is positive but smaller, *fails* where it is not
  positive. The row holds if every setting holds, holds in direction only if every setting is
  at least in direction, does not hold if none is, and otherwise holds in k of n settings;
* ``no_worse`` (a claim of parity, tolerance ``tol`` points): a setting holds where our
  difference is above −tol;
* ``ratio`` (a cost ratio b/a, e.g. bytes): holds where ours is at least half the paper's,
  in direction where it is above 1.

Writes ``benchmarks/results/claims/claims.json`` and the table between the
``<!-- report:claims -->`` markers of ``docs/benchmarks/claims.md``.

Usage: python scripts/claims_report.py [benchmarks/claims.yaml] [MARKDOWN]
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from oneshotfl.runner.report import splice_markdown

RESULTS = Path("benchmarks/results")


def series(bench: str, cell: str, key: str, field: str) -> dict[int, float]:
    """{seed: value} of method ``key`` over ``RESULTS/bench/<cell>_seed=*/result.json``
    (accuracies in percent)."""
    out: dict[int, float] = {}
    for path in sorted((RESULTS / bench).glob(f"{cell}_seed=*/result.json")):
        seed = int(re.search(r"_seed=(\d+)$", path.parent.name).group(1))  # type: ignore[union-attr]
        methods = json.loads(path.read_text())["methods"]
        row = next((m for m in methods if m["key"] == key), None)
        if row is None:
            raise ValueError(f"{path}: expected a method {key!r}, got none")
        value = float(row[field])
        out[seed] = 100 * value if field.endswith("accuracy") else value
    if not out:
        raise ValueError(f"expected results at {RESULTS / bench}/{cell}_seed=*, got none")
    return out


def reference(setting: dict[str, Any], field: str) -> tuple[str, dict[int, float]]:
    """What ``a`` is compared with: ``b``, or the best on the mean of ``best_of``."""
    bench = setting.get("b_bench", setting["bench"])
    options = setting.get("best_of") or [setting["b"]]
    found = {}
    for option in options:
        cell, key = (
            (option["cell"], option["key"])
            if isinstance(option, dict)
            else (setting.get("b_cell", setting["cell"]), option)
        )
        found[key] = series(bench, cell, key, field)
    best = max(found, key=lambda k: statistics.fmean(found[k].values()))
    return best, found[best]


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):+.2f} ± {spread:.2f}"


def judge(kind: str, ours: float, paper: float | None, tol: float) -> str:
    """``holds``, ``direction`` or ``fails`` for one setting (see the module docs)."""
    if kind == "no_worse":
        return "holds" if ours > -tol else "fails"
    if kind == "ratio":
        assert paper is not None
        return "holds" if ours >= paper / 2 else "direction" if ours > 1 else "fails"
    assert paper is not None
    return "holds" if ours >= paper / 2 else "direction" if ours > 0 else "fails"


def verdict(marks: list[str]) -> str:
    if all(m == "holds" for m in marks):
        return "holds"
    if all(m != "fails" for m in marks):
        return "holds in direction only"
    if all(m == "fails" for m in marks):
        return "does not hold"
    good = sum(m != "fails" for m in marks)
    return f"holds in {good} of {len(marks)} settings"


def evaluate(claim: dict[str, Any]) -> dict[str, Any]:
    kind, field = claim.get("kind", "beats"), claim.get("field", "accuracy")
    rows = []
    for i, setting in enumerate(claim["settings"]):
        a = series(setting["bench"], setting["cell"], setting["a"], field)
        b_key, b = reference(setting, field)
        seeds = sorted(set(a) & set(b))
        if kind == "ratio":
            values = [b[s] / a[s] for s in seeds]
            shown = f"{statistics.fmean(values):.2f}×"
        else:
            values = [a[s] - b[s] for s in seeds]
            shown = mean_std(values) + f" (n={len(seeds)})"
        paper = claim["paper_values"][i] if "paper_values" in claim else None
        mark = judge(kind, statistics.fmean(values), paper, float(claim.get("tol", 1.0)))
        rows.append({"label": setting["label"], "against": b_key, "ours": shown,
                     "values": values, "seeds": seeds, "mark": mark})  # fmt: skip
    return {**{k: claim[k] for k in ("id", "paper", "claim", "paper_number", "nearest")},
            "reason": claim.get("reason", ""), "authors": claim.get("authors", "not run"),
            "settings": rows, "verdict": verdict([r["mark"] for r in rows])}  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| # | paper | claim | the paper | nearest setting here | ours (a − b, points) "
        "| authors' code on our clients | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ours = "; ".join(
            f"{s['label']}: {s['ours']} vs `{s['against']}` ({s['mark']})" for s in r["settings"]
        )
        why = f" — {r['reason']}" if r["reason"] else ""
        lines.append(
            f"| {r['id']} | {r['paper']} | {r['claim']} | {r['paper_number']} | {r['nearest']} "
            f"| {ours} | {r['authors']} | **{r['verdict']}**{why} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/claims.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/claims.md")
    spec = yaml.safe_load(path.read_text())
    results = [evaluate(claim) for claim in spec["claims"]]
    out = RESULTS / "claims"
    out.mkdir(parents=True, exist_ok=True)
    document = {"command": f"python scripts/claims_report.py {path}", "claims": results}
    (out / "claims.json").write_text(json.dumps(document, indent=2) + "\n")
    counts = statistics.multimode([r["verdict"] for r in results])
    body = table(results) + (
        f"\n\n{len(results)} claims (`{document['command']}`; most common verdict: "
        f"{', '.join(counts)})."
    )
    splice_markdown(markdown, "claims", body)
    for r in results:
        print(f"{r['id']}: {r['verdict']}")


if __name__ == "__main__":
    main(sys.argv)
