"""The tracking backends (:data:`TRACKING`): TensorBoard event files and MLflow runs, and the
one-run protocol they share (:class:`RunLog`); :mod:`oneshotfl.tracking` drives them."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from oneshotfl.registry import Registry
from oneshotfl.runner.config import ConfigError

#: The default directory of each backend.
DEFAULT_DIRS = {"tensorboard": Path("runs/tensorboard"), "mlflow": Path("runs/mlflow")}


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
"""A backend: ``(directory or None for its default, group, run name) -> RunLog``. A backend
with a store to reach (MLflow) also has a static ``reach_store(directory, group)``, called
before any training; what it returns reaches the backend as its keyword ``store``."""


LIBRARIES = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "mlflow": ("mlflow.tracking", "mlflow-skinny"),
}
"""Backend → (module its writer needs, the package that provides it)."""


TRACKING: Registry[Backend] = Registry("tracking backend")


def missing_library(backend: str, module: str) -> ConfigError:
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
            raise missing_library("tensorboard", "tensorboard") from None
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
    experiment found or made up front (:meth:`reach_store`, before any training, so a wrong URI
    or an unreachable server is a one-line error at once); the run is made on first use."""

    def __init__(
        self, root: Path | None, group: str, run: str, store: tuple[Any, str] | None = None
    ) -> None:
        self.client, experiment = store or self.reach_store(root, group)
        tags = {"oneshotfl.group": group}
        self.run_id = self.client.create_run(experiment, run_name=run, tags=tags).info.run_id

    @staticmethod
    def reach_store(root: Path | None, group: str) -> tuple[Any, str]:
        """The store's client and the id of the experiment ``group`` (made if missing).

        Raises:
            ConfigError: when the library is missing or the store cannot be reached.
        """
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise missing_library("mlflow", "mlflow-skinny") from None
        uri = os.environ.get("MLFLOW_TRACKING_URI") if root is None else None
        if uri:  # the user's store or server: MLflow places the artifacts
            try:  # a server that does not answer fails after 2 tries, not MLflow's minutes
                with _environ(
                    MLFLOW_HTTP_REQUEST_MAX_RETRIES="1", MLFLOW_HTTP_REQUEST_TIMEOUT="10"
                ):
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
def _environ(**values: str) -> Iterator[None]:
    """Environment variables set for the block, unless the user set them already."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


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
