"""Experiment tracking: a run's settings, results and training curves in TensorBoard or MLflow.

``oneshotfl run --track tensorboard`` (or ``mlflow``; both may be given) and the same option of
``oneshotfl sweep`` log, per run:

* **parameters** — the resolved experiment config, every method's hyper-parameters
  (``method.<key>.<name>``), the data facts (``data.*``) and the environment
  (``environment.*``: versions, device, CPU, git commit, the data's hash); TensorBoard also
  gets them as HParams, with each method's accuracy as the metric;
* **training curves, live** — every per-epoch loss of the one training layer and every
  synthesis round's generator and learner loss (``loss/<what was trained>``: the server's
  distillation, pseudo-label and synthesis losses and the clients' training — the clients'
  only when they run in the main process, ``workers=1``: a worker process logs nothing);
* **results** — per method ``<key>/accuracy``, ``personal_accuracy``, best/worst client,
  ``upload_bytes_mean``, ``download_bytes_per_client``, client and server seconds, accuracy per
  round of multi-round methods and each client's personal accuracy (step = client id); per
  client ``clients/train_size`` and ``clients/val_size`` (step = client id);
* **artefacts** — the run's result files: ``result.json``, the CSVs and the PNG plots
  (TensorBoard: the PNGs as images, the tables as text).

A sweep logs one run per grid point, grouped under the sweep's name (an MLflow experiment; a
TensorBoard directory); ``--track-experiment`` and ``--track-run`` name them instead. Tags have
no spaces (``loss/client_0_erm_cnn``). A run is opened on its first record, so a run refused
before training leaves no run behind (no failed MLflow run, no empty event file; MLflow's store
is reached, and the experiment found or made, before training — a wrong
``MLFLOW_TRACKING_URI`` is a one-line error then); a run that fails after that is marked
failed. Backends are a registry (:data:`TRACKING`); the libraries are the
``track`` extra (``pip install 'oneshotfl[track]'``) and are imported only when asked for.

* ``tensorboard`` writes event files with ``torch.utils.tensorboard.SummaryWriter`` (the
  ``tensorboard`` package's format) to ``DIR/<group>/<run>`` (``DIR`` default
  ``runs/tensorboard``); view with ``tensorboard --logdir runs/tensorboard``.
* ``mlflow`` logs to ``MLFLOW_TRACKING_URI`` when it is set and no ``--track-dir`` is given
  (a server, or any store MLflow takes), else to a local store with no server:
  ``DIR/mlflow.db`` (SQLite) and ``DIR/artifacts`` (``DIR`` default ``runs/mlflow``, beside
  ``runs/tensorboard``); view with ``mlflow ui --backend-store-uri
  sqlite:///runs/mlflow/mlflow.db``. (MLflow 3 refuses its
  plain-file store unless told otherwise; SQLite is its supported local backend.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from oneshotfl.runner.config import ConfigError
from oneshotfl.tracking.backends import (
    DEFAULT_DIRS,
    LIBRARIES,
    TRACKING,
    Backend,
    MlflowLog,
    RunLog,
    TensorBoardLog,
    missing_library,
    tag_name,
)
from oneshotfl.training.progress import Advance, NullTracker, Tracker

_PER_METHOD = (
    "accuracy",
    "personal_accuracy",
    "accuracy_best",
    "accuracy_worst",
    "upload_bytes_mean",
    "download_bytes_per_client",
    "client_wall_s_mean",
    "server_wall_s",
)


class LazyLog:
    """A run log opened on its first record, so a run refused before training leaves no run
    in the store; closing one that never opened does nothing."""

    def __init__(self, make: Callable[[], RunLog]) -> None:
        self.make = make
        self.log: RunLog | None = None

    def _open(self) -> RunLog:
        if self.log is None:
            self.log = self.make()
        return self.log

    def scalar(self, tag: str, step: int, value: float) -> None:
        self._open().scalar(tag, step, value)

    def params(self, values: Mapping[str, str]) -> None:
        self._open().params(values)

    def files(self, paths: Sequence[Path]) -> None:
        self._open().files(paths)

    def hparams(self, values: Mapping[str, str], metrics: Mapping[str, float]) -> None:
        self._open().hparams(values, metrics)

    def close(self, failed: bool = False) -> None:
        if self.log is not None:
            self.log.close(failed)


class TrackedProgress:
    """A progress tracker that also sends series to the run logs (one step counter per tag,
    so a model trained twice under one name continues its curve)."""

    def __init__(self, inner: Tracker | None, logs: Sequence[RunLog]) -> None:
        self.inner = inner or NullTracker()
        self.logs = tuple(logs)
        self.steps: dict[str, int] = {}

    def task(self, description: str, total: int) -> contextlib.AbstractContextManager[Advance]:
        return self.inner.task(description, total)

    def scalar(self, tag: str, step: int, value: float) -> None:
        index = self.steps.get(tag, 0)
        self.steps[tag] = index + 1
        for log in self.logs:
            log.scalar(tag, index, value)


def open_logs(backends: Sequence[str], group: str, run: str, root: Path | None) -> list[RunLog]:
    """One run log per backend name (``root``: every backend's directory; else its default).

    Raises:
        ConfigError: for an unknown backend, or one whose library is not installed.
    """
    names = list(dict.fromkeys(backends))
    unknown = [n for n in names if n not in TRACKING]
    if unknown:
        raise ConfigError(
            f"--track: expected one of {', '.join(TRACKING.names())}, got {unknown[0]!r}"
        )
    for name in names:  # a missing library is a one-line error now, not after training
        module, package = LIBRARIES.get(name, (None, None))
        if module and package:
            try:
                importlib.import_module(module)
            except ImportError:
                raise missing_library(name, package) from None
    logs: list[RunLog] = []
    for name in names:
        backend: Any = TRACKING.get(name)
        reach = getattr(backend, "reach_store", None)  # reach the store now, before training
        extra = {} if reach is None else {"store": reach(root, group)}
        logs.append(LazyLog(functools.partial(backend, root, group, run, **extra)))
    return logs


@contextlib.contextmanager
def tracked(
    backends: Sequence[str], group: str, run: str, root: Path | None, inner: Tracker | None
) -> Iterator[tuple[Tracker | None, list[RunLog]]]:
    """The progress tracker to run with, and the open run logs (closed on exit, marked
    failed if the body raised); with no backends, ``inner`` and no logs."""
    logs = open_logs(backends, group, run, root)
    if not logs:
        yield inner, logs
        return
    try:
        yield TrackedProgress(inner, logs), logs
    except BaseException:
        for log in logs:
            log.close(failed=True)
        raise
    for log in logs:
        log.close()


def log_result(logs: Sequence[RunLog], doc: Mapping[str, Any], out_dir: Path | None) -> None:
    """Log a finished run's parameters, results and files (see the module docs); with no
    ``out_dir`` (a run that wrote no files) no artefacts."""
    if not logs:
        return
    params = {k: _text(v) for k, v in doc["config"].items()}
    for m in doc["methods"]:
        params.update({f"method.{m['key']}.{k}": _text(v) for k, v in m.get("params", {}).items()})
    params.update({f"data.{k}": _text(v) for k, v in doc.get("data", {}).items()})
    params.update({f"environment.{k}": _text(v) for k, v in doc.get("environment", {}).items()})
    params.update({f"failed.{k}": v for k, v in doc.get("failed_methods", {}).items()})
    metrics = {f"{m['key']}/accuracy": float(m["accuracy"]) for m in doc["methods"]}
    points = list(result_points(doc))
    files = (
        []
        if out_dir is None
        else sorted(
            p
            for p in [*out_dir.iterdir(), *out_dir.glob("models/*.safetensors")]
            if p.is_file() and p.suffix != ".tmp"
        )
    )
    for log in logs:
        log.params(params)
        log.hparams(params, metrics)
        for tag, step, value in points:
            log.scalar(tag, step, value)
        log.files(files)


def result_points(doc: Mapping[str, Any]) -> Iterator[tuple[str, int, float]]:
    """``(tag, step, value)`` of every number logged from a result document."""
    for m in doc["methods"]:
        key = m["key"]
        for name in _PER_METHOD:
            if isinstance(m.get(name), int | float):
                yield f"{key}/{name}", 0, float(m[name])
        for row in m.get("rounds_history") or []:
            yield f"{key}/accuracy_by_round", int(row["round"]), float(row["accuracy"])
        for cid, value in enumerate(m.get("client_personal_accuracy") or []):
            if value is not None:
                yield f"{key}/client_personal_accuracy", cid, float(value)
    for row in doc.get("clients", []):
        yield "clients/train_size", int(row["client"]), float(row["train_size"])
        yield "clients/val_size", int(row["client"]), float(row["val_size"])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


__all__ = [
    "DEFAULT_DIRS",
    "TRACKING",
    "Backend",
    "LazyLog",
    "MlflowLog",
    "RunLog",
    "TensorBoardLog",
    "TrackedProgress",
    "log_result",
    "open_logs",
    "result_points",
    "tag_name",
    "tracked",
]
