"""Comparing result documents: what must be identical between two runs of one experiment.

Two runs of the same config on the same machine and thread count — the local simulation and
Flower, or the code before and after a refactor — must agree exactly on every method's
metrics, byte counts and clients, and on the per-client data facts; wall times, dates and
environment facts are not compared. :func:`result_differences` lists what differs in
sentences; :func:`compare_trees` pairs every ``result.json`` of two result folders (a sweep
before and after a change) and summarises.

Result files written before the typed per-method results (oneshotfl 0.1, issue 10) kept each
client's local accuracy in ``clients[*]`` rather than per method; such a file is compared
with a newer one by requiring that some method of the newer file reports exactly those local
accuracies (the plain local-training recipe's). Issue 10 changed that on purpose: a run no
longer trains a plain local model that none of its methods uses, and a method with a local
model of its own (FedAGE's encoder + head) reports that one. So in a before/after comparison
of folders a legacy local-accuracy difference is listed apart, as intended
(:data:`UNUSED_LOCAL`); a change of the plain local model itself still shows, in the metrics
of the methods built on it (``local``, ``fedavg``, ``ensemble``, …).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oneshotfl.environment import kernel_differences
from oneshotfl.runner.config import config_defaults
from oneshotfl.runner.config_values import run_defaults
from oneshotfl.runner.results import RECORDED_BEFORE

COMPARED = (
    "key",
    "accuracy",
    "personal_accuracy",
    "per_class_accuracy",
    "accuracy_best",
    "accuracy_worst",
    "client_accuracy",
    "upload_bytes_per_client",
    "download_bytes_per_client",
    "clients_used",
    "rejected",
)
"""Method fields compared whenever present in the reference."""

COMPARED_IF_BOTH = (
    "client_personal_accuracy",
    "local_test_accuracy",
    "local_val_accuracy",
    "client_facts",
    "topology",
    "inference",
)
"""Method fields compared when both documents have them (newer result files)."""

CLIENT_FIELDS = ("client", "arch", "train_size", "val_size", "label_histogram")
LEGACY_LOCAL = ("local_test_accuracy", "local_val_accuracy")
UNUSED_LOCAL = "no method of the newer run reports these"
"""Ends a legacy local-accuracy difference: issue 10 made it on purpose (see the module docs);
:func:`compare_trees` lists such lines as intended."""


def _history(method: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (h["round"], h["accuracy"], h["upload_bytes_mean"], h["download_bytes"])
        for h in method.get("rounds_history", [])
    ]


def _method_differences(
    a: Mapping[str, Any], b: Mapping[str, Any], labels: Sequence[str]
) -> list[str]:
    diffs = []
    names = [n for n in COMPARED if n in a]
    names += [n for n in COMPARED_IF_BOTH if n in a and n in b]
    for name in names:
        if a.get(name) != b.get(name):
            diffs.append(
                f"{a['key']}.{name}: {a.get(name)!r} {labels[0]}, {b.get(name)!r} {labels[1]}"
            )
    if _history(a) != _history(b):
        diffs.append(f"{a['key']}.rounds_history differs")
    return diffs


def _legacy_local(ref: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """An older file's per-client local accuracies must be some newer method's."""
    diffs = []
    for field in LEGACY_LOCAL:
        old = [c.get(field) for c in ref["clients"]]
        if all(v is None for v in old) or any(field in c for c in new["clients"]):
            continue
        if not any(m.get(field) == old for m in new["methods"]):
            diffs.append(f"clients' {field} {old}: {UNUSED_LOCAL}")
    return diffs


def result_differences(
    ref: Mapping[str, Any], new: Mapping[str, Any], labels: Sequence[str] = ("before", "after")
) -> list[str]:
    """What differs between two result documents in what must be identical (see the module
    docs); ``labels`` name the two sides in the sentences."""
    keys = [[m["key"] for m in doc["methods"]] for doc in (ref, new)]
    failed = [dict(doc.get("failed_methods") or {}) for doc in (ref, new)]
    if keys[0] != keys[1] or failed[0] != failed[1]:
        diffs = [f"methods: {keys[0]} {labels[0]}, {keys[1]} {labels[1]}"]
        if failed[0] != failed[1]:
            diffs = [f"failed methods: {failed[0]} {labels[0]}, {failed[1]} {labels[1]}"]
        return diffs
    diffs = []
    for a, b in zip(ref["methods"], new["methods"], strict=True):
        diffs += _method_differences(a, b, labels)
    if len(ref["clients"]) != len(new["clients"]):
        return [*diffs, f"clients: {len(ref['clients'])} {labels[0]}, {len(new['clients'])}"]
    for a, b in zip(ref["clients"], new["clients"], strict=True):
        for name in CLIENT_FIELDS:
            if a.get(name) != b.get(name):
                diffs.append(
                    f"client {a.get('client')}.{name}: {a.get(name)!r} {labels[0]}, "
                    f"{b.get(name)!r} {labels[1]}"
                )
    if ref.get("graph") is not None and ref.get("graph") != new.get("graph"):
        diffs.append(f"graph: {ref.get('graph')} {labels[0]}, {new.get('graph')} {labels[1]}")
    return diffs + _legacy_local(ref, new)


EXECUTION_ONLY = ("workers", "cache_dir", "hold_payloads", "memo_mb")
"""Config keys that never change a result (how it ran, where it cached)."""


def config_differences(
    ref: Mapping[str, Any], new: Mapping[str, Any], labels: Sequence[str] = ("before", "after")
) -> list[str]:
    """The config keys two results differ in (``alpha: 0.1 before, 0.5 after``), besides the
    execution-only ones; a key a result predates counts as the value it ran with — its
    :data:`~oneshotfl.runner.results.RECORDED_BEFORE` entry where a default changed, else the
    key's default (a new setting whose default keeps the old behaviour needs no entry)."""
    defaults = config_defaults()
    a = {**defaults, **RECORDED_BEFORE, **ref.get("config", {})}
    b = {**defaults, **RECORDED_BEFORE, **new.get("config", {})}
    for c in (a, b):  # only the defaults of methods that ran can change a result
        c["method_defaults"] = run_defaults(c.get("methods") or [], c["method_defaults"])
    return [
        f"{key}: {a.get(key)!r} {labels[0]}, {b.get(key)!r} {labels[1]}"
        for key in sorted(set(a) | set(b))
        if key not in EXECUTION_ONLY and a.get(key) != b.get(key)
    ]


def other_kernels(ref: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The float-kernel facts two results do not share
    (:func:`~oneshotfl.environment.kernel_differences`): where there are any, the same config
    need not give bit-identical numbers, and a difference says nothing of the code."""
    return kernel_differences(ref.get("environment") or {}, new.get("environment") or {})


def read_result(path: Path) -> dict[str, Any]:
    """A result document from ``path`` (a ``result.json`` or a folder holding one).

    Raises:
        ValueError: when there is no readable result document there.
    """
    file = path / "result.json" if path.is_dir() else path
    try:
        doc: dict[str, Any] = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"expected a result.json at {file}: {exc}") from None
    return doc


def compare_trees(
    ref: Path,
    new: Path,
    labels: Sequence[str] = ("before", "after"),
    changed: Sequence[str] = (),
) -> dict[str, Any]:
    """Every ``result.json`` under ``ref`` against the one at the same relative path under
    ``new``: a summary with each run's differences (a run missing on either side is one).

    ``changed`` names methods (a method name covers all its keys, e.g. ``fedcvae`` covers
    ``fedcvae:variant=kd``) whose results are meant to differ: their differences are listed
    apart, under ``changed_as_intended``, and do not count against the comparison; so do the
    legacy per-client local accuracies no newer method reports (:data:`UNUSED_LOCAL`)."""
    runs = sorted(p.parent.relative_to(ref) for p in ref.rglob("result.json"))
    others = {p.parent.relative_to(new) for p in new.rglob("result.json")}
    report: dict[str, Any] = {"reference": str(ref), "compared": str(new), "runs": {}}
    methods = identical = 0
    for run in runs:
        if run not in others:
            report["runs"][str(run)] = [f"missing {labels[1]}"]
            continue
        a, b = read_result(ref / run), read_result(new / run)
        diffs = result_differences(a, b, labels)
        configs = config_differences(a, b, labels)
        if configs:
            report.setdefault("config_differences", {})[str(run)] = configs
        if diffs and (kernels := other_kernels(a, b)):
            report.setdefault("other_kernels", {})[str(run)] = kernels
        intended = [d for d in diffs if _about(d, a, changed) or d.endswith(UNUSED_LOCAL)]
        report["runs"][str(run)] = [d for d in diffs if d not in intended]
        if intended:
            report.setdefault("changed_as_intended", {})[str(run)] = intended
        methods += len(a["methods"])
        if [m["key"] for m in a["methods"]] == [m["key"] for m in b["methods"]]:
            pairs = zip(a["methods"], b["methods"], strict=True)
            identical += sum(
                not _method_differences(x, y, labels)
                for x, y in pairs
                if not _is_changed(x, changed)
            )
    for run in sorted(others - set(runs)):
        report["runs"][str(run)] = [f"missing {labels[0]}"]
    report["summary"] = {
        "runs": len(report["runs"]),
        "runs_identical": sum(not d for d in report["runs"].values()),
        "method_rows": methods,
        "method_rows_identical": identical,
        "methods_changed_as_intended": sorted(changed),
    }
    return report


def _is_changed(method: Mapping[str, Any], changed: Sequence[str]) -> bool:
    return method["method"] in changed or method["key"] in changed


def _about(diff: str, doc: Mapping[str, Any], changed: Sequence[str]) -> bool:
    """Whether a difference line is about a method listed in ``changed``."""
    return any(diff.startswith(m["key"] + ".") and _is_changed(m, changed) for m in doc["methods"])


def compare_paths(reference: Path, other: Path, changed: Sequence[str] = ()) -> dict[str, Any]:
    """What ``oneshotfl compare`` reports: :func:`compare_trees` for two folders of runs, else
    the differences of two results (``runs``, ``summary``, and ``config_differences`` and
    ``other_kernels`` where there are any).

    Raises:
        ValueError: for a path that holds no readable result.
    """
    if reference.is_dir() and not (reference / "result.json").exists():
        return compare_trees(reference, other, changed=changed)
    a, b = read_result(reference), read_result(other)
    diffs = result_differences(a, b)
    report: dict[str, Any] = {"runs": {str(other): diffs}}
    report["summary"] = {"runs": 1, "runs_identical": int(not diffs)}
    if config_differences(a, b):
        report["config_differences"] = {str(other): config_differences(a, b)}
    if diffs and other_kernels(a, b):
        report["other_kernels"] = {str(other): other_kernels(a, b)}
    return report
