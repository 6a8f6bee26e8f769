"""The seed papers' headline claims against our committed results (issues 43 and 51).

``benchmarks/claims.yaml`` lists, per claim, the paper's number and the settings of ours that
come nearest: for each setting a method ``a`` of a committed sweep and what it is compared with
(``b``: one method, or ``best_of`` several, the best on the mean; ``b_cell`` and
``b_bench`` where it ran in another cell or sweep). This script reads the ``result.json``
files and, per setting, the **paired** difference ``a − b`` over the seeds both ran (the same
federations): its mean and 95% t-interval (:mod:`oneshotfl.intervals`). One rule gives each
setting a verdict from that interval:

* ``beats`` (the paper's margin per setting): **holds** where the interval's lower end is at
  least half the paper's margin, **in direction** where it is above 0, **fails** where the
  upper end is below 0, **inconclusive** otherwise (and with fewer than 2 seeds); a setting
  whose margin is ``null`` (the paper gives a direction, no number) holds where the lower end
  is above 0;
* ``no_worse`` (a claim of parity, tolerance ``tol`` points): the same rule on ``a − b + tol``
  with no margin: holds where the lower end is above −tol, fails where the upper end is below
  −tol;
* ``ratio`` (a cost ratio b/a, e.g. bytes, the same on every seed): holds where the interval's
  lower end is above 1 by at least half the paper's margin (1 + (paper − 1) / 2), in direction
  where it is above 1, fails where the upper end is below 1.

A row's verdict is its settings' verdict when they agree, else the count of each. A row whose
result files are missing says which and is left out of the verdict count; a row on fewer than
``MIN_SEEDS`` seeds is flagged. Writes ``benchmarks/results/claims/claims.json`` and the table
between the ``<!-- report:claims -->`` markers of ``docs/benchmarks/claims.md``.

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

from oneshotfl.intervals import VERDICTS, Interval, claim_verdict, mean_interval
from oneshotfl.methods.base import parse_method_spec
from oneshotfl.runner.report import splice_markdown

RESULTS = Path("benchmarks/results")
MIN_SEEDS = 5
"""The seeds a claims row needs (issue 51); a row on fewer is flagged."""


def series(bench: str, cell: str, key: str, field: str) -> dict[int, float]:
    """{seed: value} of method ``key`` over ``RESULTS/bench/<cell>_seed=*/result.json``
    (accuracies in percent)."""
    out: dict[int, float] = {}
    for path in sorted((RESULTS / bench).glob(f"{cell}_seed=*/result.json")):
        seed = int(re.search(r"_seed=(\d+)$", path.parent.name).group(1))  # type: ignore[union-attr]
        doc = json.loads(path.read_text())
        row = next((m for m in doc["methods"] if m["key"] == key), None)
        if row is None and key in (doc.get("failed_methods") or {}):
            continue  # it failed on this seed: the seeds it ran are paired
        if row is None and key not in configured_keys(doc):
            continue  # a claim seed that ran other methods (a sweep's claim_seeds)
        if row is None or row.get(field) is None:
            raise ValueError(f"{path}: expected method {key!r} with a {field!r}, got none")
        value = float(row[field])
        out[seed] = 100 * value if field.endswith("accuracy") else value
    if not out:
        raise ValueError(f"expected results at {RESULTS / bench}/{cell}_seed=*, got none")
    return out


def configured_keys(doc: dict[str, Any]) -> set[str]:
    """The result keys of the methods a run was configured with."""
    specs = (doc.get("config") or {}).get("methods") or []
    return {parse_method_spec(str(spec)).key for spec in specs}


def reference(setting: dict[str, Any], field: str) -> tuple[str, dict[int, float]]:
    """What ``a`` is compared with: ``b``, or the best on the mean of ``best_of`` over the
    seeds every option ran (a sweep's claim seeds run only the best, so it is chosen on the
    seeds the whole sweep ran)."""
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
    shared = set.intersection(*(set(values) for values in found.values()))
    best = max(
        found,
        key=lambda k: statistics.fmean(v for s, v in found[k].items() if s in shared or not shared),
    )
    return best, found[best]


def judge(kind: str, values: list[float], paper: float | None, tol: float) -> tuple[str, str]:
    """One setting's verdict (see the module docs) and how its interval reads."""
    found = mean_interval(values)
    if kind == "ratio":
        if paper is None:
            raise ValueError("a ratio claim: expected a paper ratio in paper_values, got none")
        shown = f"{found.mean:.2f}×" + (
            f" [{found.low:.2f}, {found.high:.2f}]" if found.available else " (CI n/a)"
        )
        if not found.available:
            return "inconclusive", shown
        if found.low > 1 and found.low >= 1 + (paper - 1) / 2:  # half the paper's margin
            return "holds", shown
        return ("in direction" if found.low > 1 else "fails" if found.high < 1
                else "inconclusive"), shown  # fmt: skip
    if kind == "no_worse":
        shifted = Interval(found.mean + tol, found.low + tol, found.high + tol, found.n,
                           found.level, found.reason)  # fmt: skip
        return claim_verdict(shifted), found.bracket()
    return claim_verdict(found, paper), found.bracket()


def verdict(marks: list[str]) -> str:
    """A row's verdict: its settings' when they agree, else how many of each."""
    if len(set(marks)) == 1:
        return marks[0]
    counts = {m: marks.count(m) for m in VERDICTS if m in marks}
    return "mixed: " + ", ".join(f"{k} in {n}" for k, n in counts.items())


def evaluate(claim: dict[str, Any]) -> dict[str, Any]:
    kind, field = claim.get("kind", "beats"), claim.get("field", "accuracy")
    head = {k: claim[k] for k in ("id", "paper", "claim", "paper_number", "nearest")}
    head |= {"reason": claim.get("reason", ""), "authors": claim.get("authors", "not run")}
    rows = []
    try:
        for i, setting in enumerate(claim["settings"]):
            a = series(setting["bench"], setting["cell"], setting["a"], field)
            b_key, b = reference(setting, field)
            seeds = sorted(set(a) & set(b))
            if kind == "ratio":
                values = [b[s] / a[s] for s in seeds]
            else:
                values = [a[s] - b[s] for s in seeds]
            paper = claim["paper_values"][i] if "paper_values" in claim else None
            mark, shown = judge(kind, values, paper, float(claim.get("tol", 1.0)))
            rows.append({"label": setting["label"], "against": b_key, "ours": shown,
                         "n": len(seeds), "values": values, "seeds": seeds,
                         "mark": mark})  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        why = str(exc) if isinstance(exc, OSError | ValueError) else f"{type(exc).__name__}: {exc}"
        return {**head, "settings": rows, "missing": why, "verdict": "missing results"}
    fewest = min(r["n"] for r in rows)
    return {**head, "settings": rows, "fewest_seeds": fewest,
            "verdict": verdict([r["mark"] for r in rows])}  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| # | paper | claim | the paper | nearest setting here "
        "| ours (a − b, points: paired mean [95% interval], n seeds) "
        "| authors' code on our clients | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "missing" in r:
            ours = f"result files missing: {r['missing']}"
        else:
            ours = "; ".join(
                f"{s['label']}: {s['ours']} (n={s['n']}) vs `{s['against']}` ({s['mark']})"
                for s in r["settings"]
            )
            if r["fewest_seeds"] < MIN_SEEDS:
                ours += f" — fewer than {MIN_SEEDS} seeds"
        why = f" — {r['reason']}" if r["reason"] else ""
        lines.append(
            f"| {r['id']} | {r['paper']} | {r['claim']} | {r['paper_number']} | {r['nearest']} "
            f"| {ours} | {r['authors']} | **{r['verdict']}**{why} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv[1:]):
        print(__doc__)
        return
    if len(argv) > 3 or any(a.startswith("-") for a in argv[1:]):
        sys.exit(f"claims_report.py: expected [CLAIMS_YAML] [MARKDOWN], got {argv[1:]}")
    path = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/claims.yaml")
    markdown = Path(argv[2]) if len(argv) > 2 else Path("docs/benchmarks/claims.md")
    for given, what in ((path, "claims file"), (markdown, "page")):
        if not given.is_file():
            sys.exit(f"claims_report.py: expected a {what} at {given}, found none")
    spec = yaml.safe_load(path.read_text())
    results = [evaluate(claim) for claim in spec["claims"]]
    out = RESULTS / "claims"
    out.mkdir(parents=True, exist_ok=True)
    document = {"command": f"python scripts/claims_report.py {path}", "claims": results}
    (out / "claims.json").write_text(json.dumps(document, indent=2) + "\n")
    counted = [r for r in results if "missing" not in r]
    tally = {v: sum(r["verdict"] == v for r in counted) for v in VERDICTS}
    mixed = sum(r["verdict"].startswith("mixed") for r in counted)
    short = sum(r["fewest_seeds"] < MIN_SEEDS for r in counted)
    summary = ", ".join(f"{n} {v}" for v, n in tally.items() if n)
    summary += f", {mixed} mixed" if mixed else ""
    left_out = [r["id"] for r in results if "missing" in r]
    body = table(results) + (
        f"\n\n{len(counted)} claims counted (`{document['command']}`): {summary}"
        + (f"; {short} on fewer than {MIN_SEEDS} seeds" if short else "")
        + (f"; left out, result files missing: {', '.join(left_out)}" if left_out else "")
        + "."
    )
    splice_markdown(markdown, "claims", body)
    for r in results:
        print(f"{r['id']}: {r['verdict']}" + (f" ({r['missing']})" if "missing" in r else ""))


if __name__ == "__main__":
    main(sys.argv)
