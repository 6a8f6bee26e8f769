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
before training leaves nothing behind (no failed MLflow run, no empty event file); a run that
fails after that is marked failed. Backends are a registry (:data:`TRACKING`); the libraries are the
``track`` extra (``pip install 'oneshotfl[track]'``) and are imported only when asked for.

* ``tensorboard`` writes event files with ``torch.utils.tensorboard.SummaryWriter`` (the
  ``tensorboard`` package's format) to ``DIR/<group>/<run>`` (``DIR`` default
  ``runs/tensorboard``); view with ``tensorboard --logdir runs/tensorboard``.
* ``mlflow`` logs to ``MLFLOW_TRACKING_URI`` when it is set and no ``--track-dir`` is given
  (a server, or any store MLflow takes), else to a local store with no server:
  ``DIR/mlflow.db`` (SQLite) and ``DIR/artifacts`` (``DIR`` default ``mlruns``); view with
  ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db``. (MLflow 3 refuses its
  plain-file store unless told otherwise; SQLite is its supported local backend.)
"""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from oneshotfl.registry import Registry
from oneshotfl.runner.config import ConfigError
from oneshotfl.training.progress import Advance, NullTracker, Tracker

#: The default directory of each backend.
DEFAULT_DIRS = {"tensorboard": Path("runs/tensorboard"), "mlflow": Path("mlruns")}
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


class RunLog(Protocol):
    """One tracked run of one backend."""

    def scalar(self, tag: str, step: int, value: float) -> None:
        """Record ``value`` at ``step`` of the series ``tag``."""
        ...

    def params(self, values: Mapping[str, str]) -> None:
        """Record the run's parameters."""
        ...

    def files(self, paths: Sequence[Path]) -> None:
        """Attach the run's result files."""
        ...

    def hparams(self, values: Mapping[str, str], metrics: Mapping[str, float]) -> None:
        """Record the parameters against the run's headline metrics."""
        ...

    def close(self, failed: bool = False) -> None:
        """End the run (``failed``: it raised)."""
        ...


Backend = Callable[[Path | None, str, str], RunLog]
"""A backend: ``(directory or None for its default, group, run name) -> RunLog``."""

_LIBRARIES = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "mlflow": ("mlflow.tracking", "mlflow-skinny"),
}
"""Backend → (module its writer needs, the package that provides it)."""


class LazyLog:
    """A run log opened on its first record, so a run refused before training leaves
    nothing in the store; closing one that never opened does nothing."""

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


TRACKING: Registry[Backend] = Registry("tracking backend")


def _missing(backend: str, module: str) -> ConfigError:
    return ConfigError(
        f"--track {backend}: expected the {module!r} package (pip install 'oneshotfl[track]'), "
        "got none installed"
    )


@TRACKING.register("tensorboard", "TensorBoard event files, one directory per run")
class TensorBoardLog:
    """Event files in ``root/group/run``."""

    def __init__(self, root: Path | None, group: str, run: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch's writer needs the tensorboard package
            raise _missing("tensorboard", "tensorboard") from None
        root = root or DEFAULT_DIRS["tensorboard"]
        self.dir = root / _path_part(group) / _path_part(run)
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def scalar(self, tag: str, step: int, value: float) -> None:
        self.writer.add_scalar(tag_name(tag), value, step)

    def params(self, values: Mapping[str, str]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in values.items())
        self.writer.add_text("config", f"| setting | value |\n|---|---|\n{rows}")

    def hparams(self, values: Mapping[str, str], metrics: Mapping[str, float]) -> None:
        """TensorBoard's HParams view, in this run's own directory (``add_hparams`` would
        make a sub-run): the parameters and the metrics, each metric also a scalar."""
        from torch.utils.tensorboard.summary import hparams

        tags = {f"hparam/{tag_name(k)}": v for k, v in metrics.items()}
        writer = self.writer._get_file_writer()
        for summary in hparams(dict(values), tags):
            writer.add_summary(summary)
        for tag, value in tags.items():
            self.writer.add_scalar(tag, value, 0)

    def files(self, paths: Sequence[Path]) -> None:
        import numpy as np
        from PIL import Image

        for path in paths:
            if path.suffix == ".png":
                image = np.asarray(Image.open(path).convert("RGB"))
                self.writer.add_image(path.stem, image, dataformats="HWC")
            elif path.suffix == ".csv":
                self.writer.add_text(path.stem, _markdown_table(path.read_text()))

    def close(self, failed: bool = False) -> None:
        self.writer.close()


@TRACKING.register("mlflow", "MLflow: $MLFLOW_TRACKING_URI, else a local SQLite store")
class MlflowLog:
    """One MLflow run in the experiment ``group``: of the store at ``MLFLOW_TRACKING_URI``
    (with no ``root``), else of the local store in ``root``. The store is reached and the
    experiment found or made up front (:meth:`connect`, before any training, so a wrong URI
    or an unreachable server is a one-line error at once); the run is made on first use."""

    def __init__(
        self, root: Path | None, group: str, run: str, store: tuple[Any, str] | None = None
    ) -> None:
        self.client, experiment = store or self.connect(root, group)
        tags = {"oneshotfl.group": group}
        self.run_id = self.client.create_run(experiment, run_name=run, tags=tags).info.run_id

    @staticmethod
    def connect(root: Path | None, group: str) -> tuple[Any, str]:
        """The store's client and the id of the experiment ``group`` (made if missing).

        Raises:
            ConfigError: when the library is missing or the store cannot be reached.
        """
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("mlflow", "mlflow-skinny") from None
        uri = os.environ.get("MLFLOW_TRACKING_URI") if root is None else None
        if uri:  # the user's store or server: MLflow places the artifacts
            try:
                client = MlflowClient(uri)
                return client, _experiment(client, group, None)
            except Exception as exc:  # MLflow raises assorted types for a bad or absent store
                raise ConfigError(
                    f"--track mlflow: expected a reachable store at MLFLOW_TRACKING_URI={uri}, "
                    f"got {type(exc).__name__}: {str(exc)[:200]}"
                ) from None
        root = (root or DEFAULT_DIRS["mlflow"]).resolve()
        root.mkdir(parents=True, exist_ok=True)
        # Sweep shards may open one store at once: creating its tables and the group's
        # experiment happens under a lock, so two processes never both create either.
        with _locked(root / ".lock"):
            client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
            return client, _experiment(client, group, str(root / "artifacts"))

    def scalar(self, tag: str, step: int, value: float) -> None:
        self.client.log_metric(self.run_id, tag_name(tag), value, step=step)

    def params(self, values: Mapping[str, str]) -> None:
        for key, value in values.items():
            self.client.log_param(self.run_id, tag_name(key), value[:6000])

    def hparams(self, values: Mapping[str, str], metrics: Mapping[str, float]) -> None:
        """MLflow shows parameters and metrics side by side already."""

    def files(self, paths: Sequence[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


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
        module, package = _LIBRARIES.get(name, (None, None))
        if module and package:
            try:
                importlib.import_module(module)
            except ImportError:
                raise _missing(name, package) from None
    logs: list[RunLog] = []
    for name in names:
        backend: Any = TRACKING.get(name)
        connect = getattr(backend, "connect", None)  # reach the store now, before training
        extra = {} if connect is None else {"store": connect(root, group)}
        logs.append(LazyLog(functools.partial(backend, root, group, run, **extra)))
    return logs


def _experiment(client: Any, group: str, artifacts: str | None) -> str:
    """The id of the experiment ``group``, made if missing — and, when another process made
    it between the look-up and the making (two sweep shards on one server), looked up again."""
    found = client.get_experiment_by_name(group)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(group, artifact_location=artifacts))
    except Exception:
        again = client.get_experiment_by_name(group)
        if again is None:
            raise
        return str(again.experiment_id)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (POSIX ``flock``; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def tag_name(tag: str) -> str:
    """A tag both backends take, without spaces: letters, digits and ``_ - . / :``; every run
    of other characters becomes one ``_`` (``loss/client 0 erm (cnn)`` becomes
    ``loss/client_0_erm_cnn``)."""
    return re.sub(r"[^\w\-./:]+", "_", tag).strip("_") or "_"


def _path_part(name: str) -> str:
    return re.sub(r"[^\w\-.=]", "_", name) or "_"


def _markdown_table(csv_text: str) -> str:
    lines = [row for row in csv.reader(io.StringIO(csv_text)) if row]
    if not lines:
        return ""
    head, *rows = lines
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])
