"""The tables of a benchmark report (:func:`oneshotfl.runner.report.write_report`): accuracy
as mean ± the half-width of its 95% t-interval over seeds, paired differences against a
reference method over the seeds both ran, upload bytes, server time and inference cost, and
the clients' own facts."""

from __future__ import annotations

from typing import Any

import numpy as np

from oneshotfl.intervals import Interval, difference_words, mean_interval, paired_difference
from oneshotfl.runner.report_plots import Report, human_bytes

__all__ = [
    "bytes_table",
    "cost_table",
    "facts_table",
    "interval_cell",
    "markdown_table",
    "paired_rows",
    "paired_table",
    "reference_method",
    "summary_rows",
]


def interval_cell(found: Interval, scale: float = 100.0) -> str:
    """A table cell: ``mean ± half-width (n=k)`` of the 95% interval, or ``mean (n=1; CI
    n/a)`` with a single seed."""
    if not found.n:
        return "–"
    shown = found.scaled(scale)
    if not shown.available:
        return f"{shown.mean:.2f} (n={shown.n}; CI n/a)"
    return f"{shown.mean:.2f} ± {shown.half_width:.2f} (n={shown.n})"


def markdown_table(report: Report) -> str:
    """Accuracy (%): mean ± the half-width of its 95% t-interval over seeds, methods as rows,
    settings as columns."""
    head = "| method | " + " | ".join(report.settings) + " | upload / client |"
    rule = "|---|" + "---:|" * (len(report.settings) + 1)
    lines = [head, rule]
    for method in report.methods:
        cells, uploads = [], []
        for setting in report.settings:
            cell = report.cells.get((setting, method))
            failed = len(report.failed.get((setting, method), []))
            if cell is None:
                cells.append(f"failed (n={failed})" if failed else "–")
                continue
            text = interval_cell(cell.interval())
            cells.append(text + (f", {failed} failed" if failed else ""))
            uploads.extend(cell.upload_bytes)
        upload = human_bytes(float(np.mean(uploads))) if uploads else "–"
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {upload} |")
    reasons = sorted({(m, why) for (_, m), whys in report.failed.items() for why in whys})
    lines += ["", *(f"- {m} failed: {why}" for m, why in reasons)] if reasons else []
    return "\n".join(lines)


def reference_method(report: Report, wanted: str | None = None) -> str | None:
    """The method paired differences are taken against: ``wanted`` (it must be a row of the
    report), else ``fedavg`` when it ran, else the first method that ran (a method that only
    failed has no values to pair); ``None`` when fewer than two methods ran."""
    if wanted is not None:
        if wanted not in report.methods:
            raise ValueError(
                f"report: expected --baseline to be one of the report's methods "
                f"({', '.join(report.methods)}), got {wanted!r}"
            )
        return wanted
    ran = [m for m in report.methods if any(k == m for _, k in report.cells)]
    if len(ran) < 2:
        return None
    return "fedavg" if "fedavg" in ran else ran[0]


def paired_rows(report: Report, reference: str) -> list[dict[str, Any]]:
    """Per setting and method, accuracy minus ``reference``'s (points) over the seeds both ran
    (the same federations): the mean, its 95% t-interval and the words for it."""
    rows = []
    for setting in report.settings:
        base = report.cells.get((setting, reference))
        if base is None:
            continue
        for method in report.methods:
            cell = report.cells.get((setting, method))
            if method == reference or cell is None:
                continue
            found, seeds = paired_difference(cell.by_seed(), base.by_seed())
            found = found.scaled(100.0)
            rows.append(
                {
                    "setting": setting,
                    "method": method,
                    "reference": reference,
                    "difference_mean": found.mean,
                    "difference_ci_low": found.low,
                    "difference_ci_high": found.high,
                    "seeds": len(seeds),
                    "verdict": difference_words(found),
                    "text": (
                        found.bracket()
                        if found.available
                        else f"{found.mean:+.2f} (CI n/a)"
                        if seeds
                        else "no common seeds"
                    ),
                }
            )
    return rows


def paired_table(report: Report, reference: str) -> str:
    """Paired differences against ``reference`` (points, mean [95% interval] over the seeds
    both ran): methods as rows, settings as columns; "" when no setting pairs anything."""
    rows = paired_rows(report, reference)
    if not rows:
        return ""
    found = {(r["setting"], r["method"]): r for r in rows}
    head = f"| minus `{reference}` | " + " | ".join(report.settings) + " |"
    lines = [head, "|---|" + "---:|" * len(report.settings)]
    for method in report.methods:
        if method == reference:
            continue
        cells = []
        for setting in report.settings:
            row = found.get((setting, method))
            if row is None:
                cells.append("–")
                continue
            words = " (no measurable difference)" if row["verdict"].startswith("no") else ""
            cells.append(f"{row['text']} (n={row['seeds']}){words}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bytes_table(report: Report) -> str:
    """Upload bytes per client for every method (mean over all its runs), with the ratio to
    the smallest non-zero upload: predictions against models at a glance."""
    uploads: dict[str, float] = {}
    for method in report.methods:
        values = [b for (_, m), c in report.cells.items() if m == method for b in c.upload_bytes]
        uploads[method] = float(np.mean(values))
    positive = [v for v in uploads.values() if v > 0]
    smallest = min(positive) if positive else 0.0
    lines = ["| method | upload / client | × smallest |", "|---|---:|---:|"]
    for method, value in sorted(uploads.items(), key=lambda kv: (kv[1], kv[0])):
        ratio = f"{value / smallest:.1f}" if value > 0 and smallest > 0 else "–"
        lines.append(f"| {method} | {human_bytes(value)} | {ratio} |")
    return "\n".join(lines)


COST_COLUMNS = {
    "parameters": "parameters of the final model",
    "flops_per_image": "forward FLOPs / image",
    "trainable_server_parameters": "trained on the server",
}
"""The inference-cost columns of :func:`cost_table` (``inference`` and diagnostics)."""


def cost_table(report: Report) -> str:
    """Per method, over all its runs: the server's seconds (mean) and what the final model
    costs to use (parameters, forward FLOPs per image, parameters the server trained — the
    mean, since heterogeneous federations differ per run; a column no run reports is left
    out). Empty when nothing was measured."""
    if not any(c.costs or any(c.server_s) for c in report.cells.values()):
        return ""
    columns = [n for n in COST_COLUMNS if any(c.costs.get(n) for c in report.cells.values())]
    head = "| method | server s (mean) | " + " | ".join(COST_COLUMNS[n] for n in columns)
    lines = [head.rstrip(" |") + " |", "|---|" + "---:|" * (len(columns) + 1)]
    for method in report.methods:
        cells = [c for (_, m), c in report.cells.items() if m == method]
        row = [f"{np.mean([s for c in cells for s in c.server_s]):.1f}"]
        for name in columns:
            values = [v for c in cells for v in c.costs.get(name, [])]
            row.append(f"{np.mean(values):.4g}" if values else "–")
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def facts_table(report: Report) -> str:
    """Per client fact (``client_facts`` of the results), its mean over each run's clients in
    %, mean ± the half-width of its 95% interval over seeds: methods as rows, settings as
    columns ("" when none)."""
    names = sorted({name for cell in report.cells.values() for name in cell.facts})
    blocks = []
    for name in names:
        values_all = [v for c in report.cells.values() for v in c.facts.get(name, [])]
        fraction = all(0.0 <= float(v) <= 1.0 for v in values_all)  # shown in %
        unit = " (%)" if fraction else ""
        lines = [f"| {name}{unit} | " + " | ".join(report.settings) + " |"]
        lines.append("|---|" + "---:|" * len(report.settings))
        for method in report.methods:
            cells = [report.cells.get((s, method)) for s in report.settings]
            if not any(c is not None and c.facts.get(name) for c in cells):
                continue
            row = []
            for cell in cells:
                values = cell.facts.get(name, []) if cell else []
                shown = mean_interval(values).scaled(100.0 if fraction else 1.0)
                if not values:
                    row.append("–")
                elif not shown.available:
                    row.append(f"{shown.mean:.2f}" if fraction else f"{shown.mean:.4g}")
                elif fraction:
                    row.append(f"{shown.mean:.2f} ± {shown.half_width:.2f}")
                else:
                    row.append(f"{shown.mean:.4g} ± {shown.half_width:.2g}")
            lines.append(f"| {method} | " + " | ".join(row) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def summary_rows(report: Report) -> list[dict[str, Any]]:
    rows = []
    for (setting, method), cell in report.cells.items():
        found = cell.interval()
        std = float(np.std(cell.accuracy, ddof=1)) if len(cell.accuracy) > 1 else float("nan")
        rows.append(
            {
                "setting": setting,
                "method": method,
                "accuracy_mean": found.mean,
                "accuracy_ci_low": found.low,
                "accuracy_ci_high": found.high,
                "accuracy_std": std,
                "seeds": len(cell.accuracy),
                "upload_bytes_mean": float(np.mean(cell.upload_bytes)),
            }
        )
    return rows
