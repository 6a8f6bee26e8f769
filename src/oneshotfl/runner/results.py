"""Run results: the typed per-method result, and writing and reading ``result.json``,
``methods.csv``, ``clients.csv`` and ``local.csv``."""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from oneshotfl._version import __version__
from oneshotfl.environment import git_commit, kernel_signature
from oneshotfl.plots import partition_heatmap
from oneshotfl.runner.config import ExperimentConfig, make_config, names_unchecked
from oneshotfl.runner.config_values import run_defaults
from oneshotfl.runner.files import json_document as json_document
from oneshotfl.runner.files import write_csv, write_json

if TYPE_CHECKING:
    from datetime import datetime

    from oneshotfl.runner.federation import ServerView
    from oneshotfl.runner.ledger import Ledger

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"
PARTIAL_FILE = "partial.json"
"""What a run cut short keeps: the result document of the methods that finished (and failed)
so far, with ``partial.pending`` naming the rest; replaced by ``result.json`` at the end."""
METHOD_COLUMNS = (
    "key",
    "method",
    "outcome",
    "accuracy",
    "personal_accuracy",
    "accuracy_best",
    "accuracy_worst",
    "rounds",
    "upload_bytes_mean",
    "download_bytes_per_client",
    "client_wall_s_mean",
    "client_own_s_mean",
    "server_wall_s",
    "receiver_wall_s_mean",
)
CLIENT_COLUMNS = ("client", "arch", "train_size", "val_size", "label_histogram")
LOCAL_COLUMNS = ("method", "client", "local_test_accuracy", "local_val_accuracy")


@dataclass(frozen=True)
class MethodResult:
    """What one method did on one federation (one entry of ``result.json``'s ``methods``).

    Accuracy fields follow :mod:`oneshotfl.runner.evaluate`: a global model or ensemble has
    ``per_class_accuracy``; personalised outcomes (``local`` and every peer method) have the
    per-client lists and the best/worst client. Bytes are counted on the wire: a client's
    upload is the sum over the edges it sent on (one edge, to the server, in a star).

    Attributes:
        download_bytes_per_client: what the server broadcast to each client (multi-round
            star methods; 0 otherwise).
        client_wall_s: seconds each client spent in ``client_update`` (timed by the runner).
        server_wall_s: seconds the server spent in ``aggregate`` (0 for peer methods).
        received_bytes_per_client: peer methods only: what each client received, the sum
            over its incoming edges.
        receiver_wall_s: peer methods only: seconds each receiver spent building its model.
        client_artefacts: per client, the artefacts its update used (``kind:key`` → seconds
            they took to make, cached or not).
        client_made_s: per client, the seconds of ``client_wall_s`` spent making artefacts.
        client_own_s: per client, the client time this method alone costs, whichever method
            ran first: its update's own work plus the artefacts no other method of the run
            used (:func:`attribute_client_time`; shared ones are in the document's
            ``shared_client_training``).
        model_file: with ``--save-models``, the final model's file, relative to the run's
            folder (:mod:`oneshotfl.protocol.saved`).
        client_facts: per fact a method reports about its clients (``Method.client_facts``,
            e.g. FedAGE's pseudo-label agreement), the per-client values.
        local_test_accuracy: per client, the test accuracy of the model this method's client
            trained (``None`` where the method trains no classifier of its own).
        local_val_accuracy: the same on the client's validation split (when it has one).
        topology: peer methods only: the edges that carried a payload, with their bytes.
        rounds_history: multi-round methods only: accuracy and bytes after each round.
        inference: what the final global model or ensemble costs to use: ``parameters``
            and forward ``flops_per_image`` (:func:`~oneshotfl.runner.evaluate.inference_cost`).
        timings: where the run's time went besides ``client_wall_s`` and ``server_wall_s``:
            ``client_diagnostics_s`` (every client's local-model check, summed) and
            ``evaluation_s`` (the outcome on the test split, and its inference cost).
        notes: one-line notes the method makes on what its run did
            (:meth:`~oneshotfl.protocol.contract.Method.notes`; also logged).
    """

    key: str
    method: str
    params: dict[str, Any]
    outcome: str
    accuracy: float
    personal_accuracy: float
    rounds: int
    upload_bytes_per_client: list[int]
    download_bytes_per_client: int
    communicates: bool
    client_wall_s: list[float]
    server_wall_s: float
    clients_used: list[int]
    per_class_accuracy: list[float] | None = None
    accuracy_best: float | None = None
    accuracy_worst: float | None = None
    client_accuracy: list[float] | None = None
    client_personal_accuracy: list[float] | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    no_reply: dict[str, str] = field(default_factory=dict)
    rounds_history: list[dict[str, Any]] = field(default_factory=list)
    topology: dict[str, Any] | None = None
    received_bytes_per_client: list[int] | None = None
    receiver_wall_s: list[float] | None = None
    client_artefacts: list[dict[str, float | None]] | None = None
    client_made_s: list[float] | None = None
    client_own_s: list[float] | None = None
    model_file: str | None = None
    local_test_accuracy: list[float | None] | None = None
    local_val_accuracy: list[float | None] | None = None
    client_facts: dict[str, list[float | None]] | None = None
    inference: dict[str, float] | None = None
    timings: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def upload_bytes_mean(self) -> float:
        return float(sum(self.upload_bytes_per_client) / max(1, len(self.upload_bytes_per_client)))

    @property
    def client_wall_s_mean(self) -> float:
        return float(sum(self.client_wall_s) / max(1, len(self.client_wall_s)))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field plus the two means; empty optional fields left out."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name in _OMIT_EMPTY and not value):
                continue
            data[f.name] = value
            if f.name == "upload_bytes_per_client":
                data["upload_bytes_mean"] = self.upload_bytes_mean
            elif f.name in ("client_wall_s", "client_own_s", "receiver_wall_s"):
                data[f"{f.name}_mean"] = float(sum(value) / max(1, len(value)))
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MethodResult:
        """Read one entry of ``result.json``'s ``methods`` back (the inverse of
        :meth:`to_dict`: ``MethodResult.from_dict(r.to_dict()) == r``).

        The two means :meth:`to_dict` adds are derived, so they are not read. Entries written
        by older versions are read too: one without ``rounds`` or ``download_bytes_per_client``
        (before multi-round methods) ran one round and downloaded nothing; keys this version
        does not know (such as the old ``client_train_s_mean``) are left out.

        Raises:
            ValueError: when a field every version writes is missing.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = {**_LEGACY_DEFAULTS, **{k: v for k, v in data.items() if k in known}}
        missing = [name for name in required_fields(cls) if name not in values]
        if missing:
            raise ValueError(
                f"method entry {data.get('key', '?')!r}: expected the fields {missing}, "
                "got an entry without them"
            )
        return cls(**values)


RECORDED_BEFORE: dict[str, Any] = {
    "local_steps": 0,
    "local_floor_epochs": 0,
    "client_batch": 1,
    "diagnostic_examples": 0,
    "server_steps": 0,
    "init": "torch",
    "client_threads": None,
    "server_threads": None,
    "method_defaults": [
        f"{name}:accepted_votes=none:fgsm_step=0.002:fgsm_steps=15:fgsm_warmup_steps=5"
        for name in ("fedeov", "fedeov_pruned", "fedeov_distilled")
    ],
}
"""Config keys added after results were first written, with the value every result written
without them ran with (0.1: no step floors, PyTorch's initialisation, client steps at the
process's own thread count — which its ``environment.threads`` records; before issue 27, FedEOV's
fifteen FGSM steps and Theorem 2 over every member; before issue 41, an unbounded step floor,
one client trained at a time and local models checked on the whole test split)."""


def recorded_config(
    values: Mapping[str, Any], environment: Mapping[str, Any] | None = None
) -> ExperimentConfig:
    """The config a ``result.json`` records: its keys, and for keys it predates the values
    it ran with (:data:`RECORDED_BEFORE`; the thread counts from its ``environment``), not
    today's defaults."""
    before = dict(RECORDED_BEFORE)
    if environment and isinstance(environment.get("threads"), int):
        before["client_threads"] = before["server_threads"] = environment["threads"]
    before["method_defaults"] = run_defaults(values.get("methods") or [], before["method_defaults"])
    with names_unchecked():  # reading a result never imports (runs) its plugins
        return make_config({**before, **values})


def required_fields(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` without a default, in order: what a document read
    back into it must hold."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


_OMIT_EMPTY = ("no_reply", "rounds_history", "notes")
_LEGACY_DEFAULTS: dict[str, Any] = {"rounds": 1, "download_bytes_per_client": 0}
"""What result files written before multi-round methods left out."""


def local_rows(methods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method and client with a local model: its local accuracies."""
    rows = []
    for m in methods:
        tests, vals = m.get("local_test_accuracy"), m.get("local_val_accuracy") or []
        for cid, acc in enumerate(tests or []):
            if acc is None:
                continue
            val = vals[cid] if cid < len(vals) else None
            rows.append(
                {
                    "method": m["key"],
                    "client": cid,
                    "local_test_accuracy": acc,
                    "local_val_accuracy": val,
                }
            )
    return rows


def write_result(out_dir: Path, doc: dict[str, Any], title_suffix: str = "") -> Path:
    """Write the CSV views, the partition heatmap and then the result document into
    ``out_dir``; returns the JSON path. Every file is written atomically (temporary file +
    rename) and ``result.json`` last: it marks a complete run (a sweep skips a run that has
    one), so a crash at any point leaves either a complete run or one that is run again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULT_FILE
    write_csv(out_dir / "methods.csv", doc["methods"], METHOD_COLUMNS)
    write_csv(out_dir / "clients.csv", doc["clients"], CLIENT_COLUMNS)
    write_csv(out_dir / "local.csv", local_rows(doc["methods"]), LOCAL_COLUMNS)
    privacy = {
        m["key"]: m["diagnostics"]["privacy"]
        for m in doc["methods"]
        if isinstance(m.get("diagnostics"), dict) and "privacy" in m["diagnostics"]
    }
    if privacy:  # per method: every uploaded field, covered by a DP guarantee or not
        write_json(out_dir / "privacy.json", privacy)
    counts = np.array([c["label_histogram"] for c in doc["clients"]])
    c = doc["config"]
    title = f"{c['dataset']} · {c['partition']} · {c['clients']} clients{title_suffix}"
    try:
        names = doc.get("data", {}).get("class_names") or ()
        partition_heatmap(counts, out_dir / "partition.png", title, names)
    except Exception as exc:  # a picture is not worth the results: say so and go on
        log.warning("could not draw %s: %s: %s", out_dir / "partition.png", type(exc).__name__, exc)
    write_json(path, doc)
    (out_dir / PARTIAL_FILE).unlink(missing_ok=True)  # the whole run is in result.json
    return path


def write_partial(out_dir: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` (a document of the methods so far) as ``out_dir/partial.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PARTIAL_FILE
    write_json(path, doc)
    return path


def iter_results(root: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every ``result.json`` under ``root`` (sorted by path) with its parsed content."""
    for path in sorted(root.rglob(RESULT_FILE)):
        try:
            yield path, json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}: expected a JSON result document, got invalid JSON ({exc})"
            ) from None


def result_document(
    view: ServerView,
    ledger: Ledger,
    results: Sequence[MethodResult],
    started: datetime,
    t0: float,
    workers: int = 1,
    shared: Sequence[Mapping[str, Any]] = (),
    failed: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The result document of a run: config, environment, data, clients, methods, cache —
    from what the server holds (``view``, no client shard) and booked (``ledger``).

    Args:
        view: the server's view of the federation that ran.
        ledger: the clients' shard reports as the engine admitted them.
        results: one result per method, in run order.
        started: when the run started (UTC).
        t0: ``time.perf_counter()`` at the start, for the wall time.
        workers: the processes its client steps ran in (execution only).
        shared: the client training several methods shared
            (:func:`oneshotfl.runner.accounting.attribute_client_time`).
        failed: the methods that failed, key → one-line reason (``failed_methods`` in the
            document; absent when none did).
    """
    task, encoder = view.task, view.encoder
    doc: dict[str, Any] = {
        "oneshotfl_version": __version__,
        "started": started.isoformat(timespec="seconds"),
        "wall_time_s": time.perf_counter() - t0,
        "environment": {
            "python": platform.python_version(),
            **kernel_signature(str(view.device)),
            "workers": workers,
            "git_commit": git_commit(),
            "data_hash": view.data_hash,
        },
        "config": view.cfg.to_dict(),
        "encoder": None
        if encoder is None
        else {
            "spec": encoder.spec,
            "fingerprint": encoder.fingerprint,
            "dim": encoder.dim,
            **encoder.info,
        },
        "data": {
            "dataset": task.dataset,
            "num_classes": task.num_classes,
            "class_names": list(task.class_names) or None,
            "input_shape": [task.in_channels, task.image_size, task.image_size],
            "client_examples": view.client_examples,
            "public_size": 0 if view.public is None else len(view.public),
            "test_size": len(view.test),
        },
        # each client's own model is checked on this many test examples (stratified sample)
        "diagnostics": {
            "examples": min(view.cfg.diagnostic_size or len(view.test), len(view.test)),
        },
        "clients": client_rows(view, ledger),
        "methods": [r.to_dict() for r in results],
        "shared_client_training": list(shared),
        "cache": {
            "hits": view.store.hits,
            "misses": view.store.misses,
            "from_disk": view.store.counts.from_disk,
        },
    }
    if any(r.topology is not None for r in results) and view.graph is not None:
        doc["graph"] = view.graph.to_dict()
    if failed:
        doc["failed_methods"] = dict(failed)
    return doc


def client_rows(view: ServerView, ledger: Ledger) -> list[dict[str, Any]]:
    """Per client: architecture, and the data sizes and label histogram it reported
    (``reported: false`` and zeros for a client whose report never arrived)."""
    rows = []
    unreported = {"train_size": 0, "val_size": 0, "label_histogram": [0] * view.task.num_classes}
    for cid, arch in enumerate(view.archs):
        report = ledger.get(cid)
        attack = view.attacks[cid]
        rows.append(
            {
                "client": cid,
                "arch": arch,
                **(report.to_dict() if report else unreported),
                **({} if report else {"reported": False}),
                **({"malicious": attack} if attack else {}),
            }
        )
    return rows
