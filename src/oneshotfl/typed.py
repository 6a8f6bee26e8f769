"""Typed results: a run's ``result.json`` (:class:`Result`) and a sweep's runs
(:class:`SweepResult`), as :func:`oneshotfl.run` and :func:`oneshotfl.sweep` return them."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oneshotfl.data.feature_skew import dataset_stats
from oneshotfl.data.user import input_statistics, is_user_spec
from oneshotfl.data.user_options import UserDataError, UserDataNotFoundError
from oneshotfl.methods.base import parse_method_spec
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Outcome
from oneshotfl.protocol.saved import load_outcome
from oneshotfl.protocol.spec import WireDims
from oneshotfl.runner.compare import read_result, result_differences
from oneshotfl.runner.config import ConfigError, ExperimentConfig
from oneshotfl.runner.results import (
    METHOD_COLUMNS,
    RESULT_FILE,
    MethodResult,
    recorded_config,
    required_fields,
    write_result,
)

__all__ = ["Result", "SweepResult"]


@dataclass(frozen=True)
class Result:
    """One run: the fields of its ``result.json``, typed.

    Attributes:
        config: the experiment configuration (settings a result file predates take their
            defaults, which reproduce what that version ran).
        methods: one record per method, in run order (``result.json``'s ``methods``).
        clients: per client: id, architecture, data sizes and label histogram.
        data: the dataset facts (name, classes, input shape, split sizes).
        environment: Python and torch versions, device and thread count of the run.
        cache: artefact-cache ``hits`` and ``misses``.
        oneshotfl_version: the version that ran it.
        started: when it started (ISO 8601, UTC).
        wall_time_s: how long it took, in seconds.
        encoder: the shared encoder's spec and fingerprint, if the run had one.
        graph: the neighbour graph, if a peer method ran.
        shared_client_training: the client training several methods shared, charged to none
            of them (``kind``, ``methods``, ``seconds_per_client``).
        failed_methods: the methods that failed, key → one-line reason (the run went on
            without them; their keys are not among :attr:`methods`).
        diagnostics: how each client's own model was checked (``examples``: the size of the
            stratified test sample; absent in results that predate it, which used the whole
            test split).
        path: the ``result.json`` this result was read from or written to, if any (not part
            of the document).
    """

    config: ExperimentConfig
    methods: tuple[MethodResult, ...]
    clients: tuple[dict[str, Any], ...]
    data: dict[str, Any]
    environment: dict[str, Any]
    cache: dict[str, Any]
    oneshotfl_version: str
    started: str
    wall_time_s: float
    encoder: dict[str, Any] | None = None
    graph: dict[str, Any] | None = None
    shared_client_training: tuple[dict[str, Any], ...] = ()
    failed_methods: dict[str, str] = field(default_factory=dict)
    diagnostics: dict[str, Any] | None = None
    path: Path | None = field(default=None, compare=False)
    _document: dict[str, Any] | None = field(default=None, init=False, compare=False, repr=False)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], path: Path | None = None) -> Result:
        """The result a ``result.json`` document describes (written by any version).

        Args:
            doc: the parsed document.
            path: where it was read from, if anywhere.

        Raises:
            ValueError: when ``doc`` is not a result document.
            ConfigError: when its config does not parse with this version.
        """
        missing = [k for k in required_fields(cls) if k not in doc]  # what every version wrote
        if missing:
            raise ValueError(f"expected a result document, got one without {missing}")
        try:
            config = recorded_config(doc["config"], doc.get("environment"))
        except ConfigError as exc:
            where = f" {path}" if path is not None else ""
            raise ConfigError(f"result{where}: its config does not parse: {exc}") from None
        result = cls(
            config=config,
            methods=tuple(MethodResult.from_dict(m) for m in doc["methods"]),
            clients=tuple(copy.deepcopy(c) for c in doc["clients"]),
            data=copy.deepcopy(dict(doc["data"])),
            environment=copy.deepcopy(dict(doc["environment"])),
            cache=copy.deepcopy(dict(doc["cache"])),
            oneshotfl_version=str(doc["oneshotfl_version"]),
            started=str(doc["started"]),
            wall_time_s=float(doc["wall_time_s"]),
            encoder=copy.deepcopy(doc.get("encoder")),
            graph=copy.deepcopy(doc.get("graph")),
            shared_client_training=tuple(copy.deepcopy(doc.get("shared_client_training", []))),
            failed_methods=dict(doc.get("failed_methods") or {}),
            diagnostics=copy.deepcopy(doc.get("diagnostics")),
            path=path,
        )
        object.__setattr__(result, "_document", copy.deepcopy(dict(doc)))
        return result

    @classmethod
    def load(cls, path: str | Path) -> Result:
        """Read a ``result.json`` (or the run folder holding one).

        Raises:
            ValueError: when there is no result document there.
        """
        file = Path(path)
        file = file / RESULT_FILE if file.is_dir() else file
        return cls.from_dict(read_result(file), path=file)

    def to_dict(self) -> dict[str, Any]:
        """The ``result.json`` document: the one this result was read from, as it was
        written (older versions wrote fewer fields), unless this result differs from it."""
        if self._document is not None and Result.from_dict(self._document) == self:
            return copy.deepcopy(self._document)
        doc: dict[str, Any] = {
            "oneshotfl_version": self.oneshotfl_version,
            "started": self.started,
            "wall_time_s": self.wall_time_s,
            "environment": copy.deepcopy(self.environment),
            "config": self.config.to_dict(),
            "encoder": copy.deepcopy(self.encoder),
            "data": copy.deepcopy(self.data),
            "clients": [copy.deepcopy(c) for c in self.clients],
            "methods": [m.to_dict() for m in self.methods],
            "cache": copy.deepcopy(self.cache),
            "shared_client_training": [copy.deepcopy(s) for s in self.shared_client_training],
        }
        if self.graph is not None:
            doc["graph"] = copy.deepcopy(self.graph)
        if self.failed_methods:
            doc["failed_methods"] = dict(self.failed_methods)
        if self.diagnostics is not None:
            doc["diagnostics"] = copy.deepcopy(self.diagnostics)
        return doc

    def save(self, out: str | Path) -> Path:
        """Write ``result.json`` and its CSV views into the folder ``out``, as a run does;
        returns the JSON path."""
        return write_result(Path(out), self.to_dict())

    def load_model(self, key: str) -> Outcome:
        """The final model(s) method ``key`` built, saved by ``--save-models``: a
        :class:`~oneshotfl.protocol.outcome.GlobalModel` or an
        :class:`~oneshotfl.protocol.outcome.Ensemble`, ready for ``predict_proba(x, device)``
        on inputs normalised as the run's were.

        Raises:
            ConfigError: when the run saved no model for it (run with ``--save-models``;
                server-free methods keep their models on the clients), or the result was not
                read from a file.
            SavedModelError: for a model saved as a plain state dict (see
                :mod:`oneshotfl.protocol.saved`).
        """
        record = self.method(key)
        if record.model_file is None:
            raise ConfigError(
                f"{key}: expected a saved model, got none (run with --save-models; a "
                "server-free method's models stay on its clients)"
            )
        if self.path is None:
            raise ConfigError(f"{key}: this result was not read from a file; its models neither")
        channels, side, _ = self.data["input_shape"]
        dims = WireDims(int(self.data["num_classes"]), int(channels), int(side))
        return load_outcome(self.path.parent / record.model_file, dims)

    def normalise(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw inputs as this run's models saw them: images ``[N, C, H, W]`` of pixels in
        [0, 1] (or ``uint8``) normalised with the dataset's mean and std; a table ``[N, D]``
        of features standardised with its training split's statistics (read again from the
        file) or the declared values — what ``load_model(key).predict_proba`` takes.

        Raises:
            ConfigError: for inputs of another shape, or a dataset whose normalisation is
                unknown here (its file gone, a plugin's dataset).
        """
        name = str(self.data["dataset"])
        channels, side, _ = (int(v) for v in self.data["input_shape"])
        values = torch.as_tensor(np.asarray(x))
        table = False
        try:
            if is_user_spec(name):
                mean, std, table = input_statistics(name)
            else:
                stats = dataset_stats(name)
                if stats is None:
                    raise ConfigError(f"normalise: no normalisation known for {name!r}")
                mean = np.asarray(stats.mean, np.float32) * np.ones(channels, np.float32)
                std = np.asarray(stats.std, np.float32) * np.ones(channels, np.float32)
        except (UserDataError, UserDataNotFoundError) as exc:
            raise ConfigError(f"normalise: {exc}") from None
        if table and values.dim() == 2:
            values = values[:, :, None, None]
        want = (channels, side, side)
        if values.dim() != 4 or tuple(values.shape[1:]) != want:
            raise ConfigError(
                f"normalise: expected inputs [N, {', '.join(map(str, want))}]"
                f"{' or [N, ' + str(channels) + ']' if table else ''}, got {list(values.shape)}"
            )
        pixels = values.to(torch.float32)
        if values.dtype == torch.uint8 and not table:
            pixels = pixels / 255.0
        shape = (1, -1, 1, 1)
        return (pixels - torch.from_numpy(mean).view(shape)) / torch.from_numpy(std).view(shape)

    def predict(self, key: str, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Class probabilities ``[N, C]`` of method ``key``'s saved model(s) on raw inputs
        (:meth:`normalise`, then :meth:`load_model`), on the CPU; column ``j`` is class
        :attr:`class_names` ``[j]`` (:meth:`predict_labels` gives the names)."""
        outcome = self.load_model(key)
        if not isinstance(outcome, GlobalModel | Ensemble):
            raise ConfigError(f"predict: {key} keeps a model per client; load it per client")
        return outcome.predict_proba(self.normalise(x), torch.device("cpu"))

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes' names in label order (a CSV's label values, a folder's subfolders, a
        registered dataset's names); ``"0"``, ``"1"``, … where the data has none (and in
        results that predate them). :meth:`predict`'s columns follow this order."""
        names = self.data.get("class_names") or []
        count = int(self.data.get("num_classes") or len(names))
        if len(names) != count:
            return tuple(map(str, range(count)))
        return tuple(str(n) for n in names)

    def predict_labels(self, key: str, x: np.ndarray | torch.Tensor) -> list[str]:
        """The class name :meth:`predict` gives the most probability, per input."""
        names = self.class_names
        return [names[i] for i in self.predict(key, x).argmax(dim=1).tolist()]

    def method(self, key: str) -> MethodResult:
        """The record of the method run as ``key`` (``fedavg``, ``ensemble:weighting=size``)
        in any spelling of the same spec (its knobs in any order), or of
        the only method of that name.

        Raises:
            KeyError: when no (or more than one) method matches.
        """
        try:
            canonical = parse_method_spec(key).key
        except ValueError:
            canonical = key
        for m in self.methods:
            if m.key in (key, canonical):
                return m
        named = [m for m in self.methods if m.method == key]
        if len(named) == 1:
            return named[0]
        raise KeyError(f"expected one of the methods {list(self.keys)}, got {key!r}")

    @property
    def keys(self) -> tuple[str, ...]:
        """The methods' keys, in run order."""
        return tuple(m.key for m in self.methods)

    @property
    def accuracy(self) -> dict[str, float]:
        """Test accuracy (global model or ensemble; mean over clients when personalised),
        by method key."""
        return {m.key: m.accuracy for m in self.methods}

    def table(self) -> list[dict[str, Any]]:
        """One row per method with the columns of ``methods.csv``."""
        rows = []
        for m in self.methods:
            values = m.to_dict()
            rows.append({c: values.get(c) for c in METHOD_COLUMNS})
        return rows

    def differences(self, other: Result, labels: Sequence[str] = ("this", "other")) -> list[str]:
        """What differs from ``other`` in what two runs of one experiment must share — every
        method's metrics, bytes and clients (see :mod:`oneshotfl.runner.compare`); empty when
        ``other`` reproduces this run."""
        return result_differences(self.to_dict(), other.to_dict(), labels)


@dataclass(frozen=True)
class SweepResult:
    """The runs of a sweep (or of the shard or seeds asked for).

    Attributes:
        name: the sweep's name.
        root: the folder holding one sub-folder per run.
        results: every run's result by run id, in sweep order (runs finished before are read
            back from their ``result.json``).
        ran: the ids of the runs this call ran (the others were finished already).
    """

    name: str
    root: Path
    results: Mapping[str, Result]
    ran: tuple[str, ...] = ()

    def __getitem__(self, run_id: str) -> Result:
        return self.results[run_id]

    def __len__(self) -> int:
        return len(self.results)

    def table(self) -> list[dict[str, Any]]:
        """One row per run and method: the run id, then the columns of ``methods.csv``."""
        return [{"run": rid, **row} for rid, r in self.results.items() for row in r.table()]
