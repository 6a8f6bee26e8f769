"""Benchmark reports: mean ± 95% interval over seeds, paired differences against a reference
method on the same federations, as markdown, CSV and PNG plots (the intervals:
:mod:`oneshotfl.intervals`)."""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from oneshotfl.runner.files import atomic_write_text, write_csv
from oneshotfl.runner.report_plots import Cell, Report, human_bytes, natural_key, report_plots
from oneshotfl.runner.report_tables import (
    bytes_table,
    cost_table,
    facts_table,
    markdown_table,
    paired_rows,
    paired_table,
    reference_method,
    summary_rows,
)
from oneshotfl.runner.results import iter_results

__all__ = [
    "collect",
    "cost_table",
    "facts_table",
    "human_bytes",
    "markdown_table",
    "natural_key",
    "splice_markdown",
    "write_report",
]


def setting_label(config: Mapping[str, Any]) -> str:
    """A short name for a run's partition setting (``dirichlet α=0.1``, ``pathological #C=2``)."""
    name = str(config.get("partition"))
    if name in ("dirichlet", "dirichlet_client"):
        return f"{name} α={config.get('alpha')}"
    if name == "pathological":
        return f"{name} #C={config.get('classes_per_client')}"
    if name == "skew":
        return f"{name} ψ={config.get('psi')} #C={config.get('classes_per_client')}"
    return name


#: Config keys that never separate settings: seeds are what a setting is averaged over, the
#: rest do not change results (or are shown by the partition label).
NOT_A_SETTING = frozenset(
    {
        "seed",
        "partition_seed",
        "methods",
        "device",
        "cache_dir",
        "data_root",
        "download",
        "partition",
        "alpha",
        "classes_per_client",
        "psi",
        "group",
    }
)


def varying_keys(
    configs: Iterable[Mapping[str, Any]], ignore: frozenset[str] = NOT_A_SETTING
) -> list[str]:
    """Config keys (other than ``ignore``: seeds and the partition) whose value differs
    between runs of the same sweep group (groups differ by design and are one setting). A key
    a run does not record (an older result, from before the knob existed) separates nothing."""
    values: dict[tuple[str, str], set[str]] = defaultdict(set)
    for config in configs:
        group = str(config.get("group", ""))
        for key, value in config.items():
            if key not in ignore:
                values[(group, key)].add(json.dumps(value, sort_keys=True))
    return sorted({key for (_, key), v in values.items() if len(v) > 1})


def method_rows(docs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(group, method key) → row name: the key, or ``key [group]`` when the key appears in
    more than one group."""
    groups_of: dict[str, set[str]] = defaultdict(set)
    for doc in docs:
        group = str(doc["config"].get("group", ""))
        for result in doc["methods"]:
            groups_of[result["key"]].add(group)
    return {
        (group, key): f"{key} [{group}]" if len(groups) > 1 and group else key
        for key, groups in groups_of.items()
        for group in groups
    }


def _repeated_runs(
    docs: list[Mapping[str, Any]], extra_keys: list[str], rows: Mapping[tuple[str, str], str]
) -> set[int]:
    """The indices of documents that share a (setting, method row, seed) with another."""
    first: dict[tuple[str, str, int], int] = {}
    repeated: set[int] = set()
    for index, doc in enumerate(docs):
        config = doc["config"]
        extra = " ".join(f"{k}={config.get(k)}" for k in extra_keys if config.get(k) is not None)
        setting = " · ".join(filter(None, [setting_label(config), extra]))
        group = str(config.get("group", ""))
        for result in doc["methods"]:
            marker = (setting, rows[(group, result["key"])], int(config.get("seed", 0)))
            if marker in first:
                repeated |= {first[marker], index}
            else:
                first[marker] = index
    return repeated


def collect(docs: Iterable[Mapping[str, Any]]) -> Report:
    """Group result documents by (setting, method key).

    A setting is the partition label plus every other config value that varies across the
    documents (e.g. ``clients=20``), so runs that differ in more than their seed never merge.
    Runs of one setting and seed that are not seeds of one sweep — a folder of separate runs
    of the same method — stay apart: each such run's setting also names its folder (the
    ``_run`` a document carries, :func:`write_report` sets it).
    """
    report = Report()
    docs = list(docs)
    extra_keys = varying_keys(doc["config"] for doc in docs)
    rows = method_rows(docs)
    twice = _repeated_runs(docs, extra_keys, rows)
    seen: set[tuple[str, str, int]] = set()
    for index, doc in enumerate(docs):
        config = doc["config"]
        group = str(config.get("group", ""))
        extra = " ".join(f"{k}={config.get(k)}" for k in extra_keys if config.get(k) is not None)
        run = f"run {doc.get('_run', index)}" if index in twice else ""
        setting = " · ".join(filter(None, [setting_label(config), extra, run]))
        report.runs += 1
        report.wall_time_s += float(doc.get("wall_time_s", 0.0))
        if setting not in report.settings:
            report.settings.append(setting)
            report.extras[setting] = {k: config.get(k) for k in extra_keys}
        if config.get("partition") == "dirichlet":
            report.alphas[setting] = (float(config["alpha"]), extra)
        for failed, why in (doc.get("failed_methods") or {}).items():
            key = rows.get((group, failed), failed)
            report.failed.setdefault((setting, key), []).append(why)
            if key not in report.methods:
                report.methods.append(key)
        for result in doc["methods"]:
            key = rows[(group, result["key"])]
            marker = (setting, key, int(config.get("seed", 0)))
            if marker in seen:
                raise ValueError(
                    f"report: two results for {key!r} in setting {setting!r} with seed "
                    f"{marker[2]}; expected one per seed (same run collected twice?)"
                )
            seen.add(marker)
            if key not in report.methods:
                report.methods.append(key)
            cell = report.cells.setdefault(
                (setting, key),
                Cell(method=result.get("method", key), params=dict(result.get("params", {}))),
            )
            cell.accuracy.append(float(result["accuracy"]))
            cell.seeds.append(marker[2])
            if result.get("personal_accuracy") is not None:
                cell.personal.append(float(result["personal_accuracy"]))
            cell.personalised |= result.get("outcome") == "Personalised"
            cell.upload_bytes.append(float(result["upload_bytes_mean"]))
            cell.server_s.append(float(result.get("server_wall_s", 0.0)))
            costs = dict(result.get("inference") or {})
            trainable = (result.get("diagnostics") or {}).get("trainable_server_parameters")
            if isinstance(trainable, int | float):
                costs["trainable_server_parameters"] = trainable
            for name, value in costs.items():
                cell.costs[name].append(float(value))
            if result.get("rounds_history"):
                cell.histories.append(list(result["rounds_history"]))
            for name, values in (result.get("client_facts") or {}).items():
                present = [float(v) for v in values if v is not None]
                if present:  # the mean over this run's clients: one value per seed
                    cell.facts[name].append(float(np.mean(present)))
    report.settings.sort(key=natural_key)  # clients=5 before clients=10
    return report


def write_report(
    results_dir: Path,
    out_dir: Path,
    title: str = "",
    link_from: Path | None = None,
    baseline: str | None = None,
) -> tuple[Report, str]:
    """Write ``table.md``, ``summary.csv``, ``paired.csv`` and PNG plots for every result under
    ``results_dir``.

    Args:
        results_dir: searched recursively for ``result.json``.
        out_dir: where the report files go.
        title: plot title.
        link_from: directory the returned markdown's image links are relative to
            (default ``out_dir``).
        baseline: the method every other one is paired against (default: ``fedavg`` when it
            ran, else the first method).

    Returns:
        The report and its markdown (table, plot links, run count and wall time).
    """
    report = collect(
        {**doc, "_run": path.parent.relative_to(results_dir).as_posix() or "."}
        for path, doc in iter_results(results_dir)
    )
    if report.runs == 0:
        raise FileNotFoundError(f"no result.json files under {results_dir}")
    reference = reference_method(report, baseline)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "summary.csv", summary_rows(report), list(summary_rows(report)[0]))
    pairs = paired_rows(report, reference) if reference else []
    if pairs:
        write_csv(out_dir / "paired.csv", pairs, list(pairs[0]))
    else:
        (out_dir / "paired.csv").unlink(missing_ok=True)
    plots = report_plots(report, out_dir, title)
    sweep_metas = [json.loads(f.read_text()) for f in sorted(results_dir.glob("sweep*.json"))]

    def render(base: Path) -> str:
        links = "\n".join(
            f"![{name}]({os.path.relpath(path, base)})" for name, path in plots.items()
        )
        minutes = report.wall_time_s / 60
        timing = f"{report.runs} runs; summed run wall time {minutes:.1f} min"
        for meta in sweep_metas:
            sweep_minutes = meta.get("wall_time_s_this_invocation", 0.0) / 60
            argv = " ".join(str(a) for a in meta.get("argv", []))
            timing += (
                f"; the sweep invocation `{argv}` ran {meta.get('ran_now')} of them in "
                f"{sweep_minutes:.1f} min"
            )
        facts = facts_table(report)
        if facts:
            facts = (
                "Facts the clients report about their own training (privacy measures, "
                "sparsity, FLOPs), measured on the clients (mean over clients, then over "
                f"seeds; fractions in %):\n\n{facts}\n\n"
            )
        costs = cost_table(report)
        if costs:
            costs = (
                "Server time and what the final model costs to use (mean over runs; "
                f"seconds measured on this machine):\n\n{costs}\n\n"
            )
        paired = paired_table(report, reference) if reference else ""
        if paired:
            paired = (
                f"Paired differences against `{reference}` on the same federations (points; "
                "mean [95% t-interval] over the seeds both ran; an interval that includes 0 "
                f"is no measurable difference):\n\n{paired}\n\n"
            )
        return (
            f"Test accuracy (%), mean ± the half-width of its 95% t-interval over seeds:\n\n"
            f"{markdown_table(report)}\n\n{paired}Upload per client (bytes counted on the "
            f"wire, summed over rounds for multi-round methods):\n\n{bytes_table(report)}\n\n"
            f"{costs}{facts}{links}\n\n{timing}.\n"
        )

    atomic_write_text(out_dir / "table.md", render(out_dir))
    text = render(link_from or out_dir)
    return report, text


def splice_markdown(document: Path, section: str, body: str) -> None:
    """Replace the text between ``<!-- report:SECTION -->`` markers in ``document``.

    Raises:
        ValueError: when the markers are missing (nothing is written then).
    """
    text = document.read_text()
    start, end = f"<!-- report:{section} -->", f"<!-- /report:{section} -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{document}: expected markers {start} … {end}, found none")
    atomic_write_text(document, pattern.sub(lambda _: f"{start}\n{body}\n{end}", text))
