"""The Python API: run an experiment or a sweep from Python and get typed results.

The same runs as the ``oneshotfl run`` and ``oneshotfl sweep`` commands, with the same
configuration (:class:`~oneshotfl.runner.config.ExperimentConfig`), the same result files
and the same errors (:class:`~oneshotfl.runner.config.ConfigError` with a one-line
message for a bad setting or method name)::

    import oneshotfl

    result = oneshotfl.run(dataset="digits", clients=3, model="mlp", methods=["fedavg"])
    result.method("fedavg").accuracy        # one method's record (a MethodResult)
    result.accuracy                         # {"fedavg": <test accuracy>}
    oneshotfl.Result.load("benchmarks/results/core-fmnist/<run>/result.json")

A :class:`Result` has the fields of ``result.json`` and reads any result file back
(:meth:`Result.load`); :meth:`Result.to_dict` is the JSON document again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from oneshotfl.runner.checks import writable_dir
from oneshotfl.runner.compare import config_differences
from oneshotfl.runner.config import (
    ConfigError,
    ExperimentConfig,
    load_config,
    make_config,
)
from oneshotfl.runner.experiment import run_experiment
from oneshotfl.runner.plan import Plan, preflight
from oneshotfl.runner.results import (
    RESULT_FILE,
    json_document,
    write_result,
)
from oneshotfl.runner.sweep import (
    PointClaims,
    Sweep,
    load_sweep,
    parse_sweep,
    select_seeds,
    select_shard,
    sweep_mapping,
    write_sweep_record,
)
from oneshotfl.tracking import log_result, tracked
from oneshotfl.training.progress import Tracker, shown_progress
from oneshotfl.typed import Result, SweepResult

__all__ = ["ConfigError", "Result", "SweepResult", "run", "sweep"]

log = logging.getLogger(__name__)

ConfigLike = ExperimentConfig | Mapping[str, Any] | str | Path
"""What :func:`run` takes as its configuration."""


def resolve_config(config: ConfigLike | None = None, /, **overrides: Any) -> ExperimentConfig:
    """The configuration :func:`run` runs: defaults < ``config`` < ``overrides``.

    Args:
        config: an :class:`ExperimentConfig`, a mapping of config keys, or a YAML file.
        **overrides: config keys (``local_epochs=1``; values as YAML or as the field's type).

    Raises:
        ConfigError: for an unknown key, a bad value or a missing file.
    """
    if config is None:
        return make_config(overrides)
    if isinstance(config, ExperimentConfig):
        return make_config({**config.to_dict(), **overrides}) if overrides else config
    if isinstance(config, str | Path):
        return load_config(config, (), overrides)
    if isinstance(config, Mapping):
        return make_config({**config, **overrides})
    raise ConfigError(
        f"config: expected an ExperimentConfig, a mapping or a YAML path, "
        f"got {type(config).__name__}"
    )


def run(
    config: ConfigLike | None = None,
    /,
    out: str | Path | None = None,
    *,
    tracker: Tracker | None = None,
    track: Sequence[str] = (),
    track_dir: str | Path | None = None,
    track_experiment: str | None = None,
    track_run: str | None = None,
    save_models: bool = False,
    progress: bool | None = None,
    **overrides: Any,
) -> Result:
    """Run every configured method on one federation, like ``oneshotfl run``.

    Args:
        config: an :class:`ExperimentConfig`, a mapping of config keys, or a YAML file
            (``None``: the defaults).
        out: a folder to write ``result.json``, the CSV views and the partition heatmap into,
            as the command does (``None``: write nothing). It must not hold a result yet.
        tracker: shows progress (default: as ``progress`` says).
        track: log the run to these tracking backends, as ``--track`` does
            (``["tensorboard", "mlflow"]``; the ``track`` extra); the run is named after
            ``out`` (else ``api``), grouped under ``oneshotfl``.
        track_dir: the tracking directory (default ``runs/tensorboard``, ``runs/mlflow``; MLflow:
            ``MLFLOW_TRACKING_URI`` when it is set and this is not).
        track_experiment: the experiment (group) to log under instead of ``oneshotfl``.
        track_run: the run's name instead of ``out``'s.
        save_models: save every star method's final model(s) beside ``result.json`` (needs
            ``out``); :meth:`Result.load_model` reads one back.
        progress: without a ``tracker``, show progress bars on stderr as the command does
            (``None``: when stderr is a terminal or a notebook; ``False``: never).
        **overrides: config keys applied on top of ``config`` (``methods=["fedavg"]``).

    Returns:
        The run's typed result (with ``path`` set when ``out`` is given).

    Raises:
        ConfigError: for a bad setting, method or model name, an unusable ``out``, or a
            tracking backend that is unknown or not installed.
    """
    cfg = resolve_config(config, **overrides)
    plan = preflight(cfg)  # what the config alone can fail on, before anything is made
    out_dir = None if out is None else Path(out)
    if out_dir is not None:  # checked before any training, as the command does
        if (out_dir / RESULT_FILE).exists():
            raise ConfigError(f"{out_dir}/{RESULT_FILE} exists; choose another out")
        writable_dir(out_dir)
    name = track_run or ("api" if out_dir is None else out_dir.name)
    named = (track_experiment or "oneshotfl", name)
    with shown_progress(tracker, progress) as shown:
        doc, path = run_and_write(plan, out_dir, shown, track, track_dir, named, save_models)
    return Result.from_dict(doc, path=path)


def run_and_write(
    plan: Plan,
    out_dir: Path | None,
    tracker: Tracker | None,
    track: Sequence[str],
    track_dir: str | Path | None,
    tracked_as: tuple[str, str],
    save_models: bool = False,
) -> tuple[dict[str, Any], Path | None]:
    """Run one checked plan, write its files into ``out_dir`` (``None``: none) and log it to the
    ``track`` backends as run ``tracked_as = (group, name)``; the one body of :func:`run`,
    :func:`sweep` and the ``run`` and ``sweep`` commands. Returns the result document (as
    ``result.json`` holds it) and the path of ``result.json``. ``save_models``: every star
    method's final model(s) into ``out_dir/models`` (:mod:`oneshotfl.protocol.saved`)."""
    if save_models and out_dir is None:
        raise ConfigError("save_models: expected an out folder to save the models in, got none")
    root = None if track_dir is None else Path(track_dir)
    with tracked(list(track), *tracked_as, root, tracker) as (progress, logs):
        save_to = out_dir if save_models else None
        doc = json_document(run_experiment(plan, progress, save_to=save_to))
        path = write_result(out_dir, doc) if out_dir is not None else None
        log_result(logs, doc, out_dir)
    return doc, path


def with_base_overrides(
    path_or_mapping: str | Path | Mapping[str, Any], overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """A sweep mapping with ``overrides`` in its ``base``.

    Raises:
        ConfigError: for an override of a key the grid or the groups set, or of the seed.
    """
    data = (
        dict(path_or_mapping)
        if isinstance(path_or_mapping, Mapping)
        else sweep_mapping(Path(path_or_mapping))
    )
    varied = {"seed", "seeds"}
    for subgrid in data.get("grid") or []:
        varied |= set(subgrid) if isinstance(subgrid, Mapping) else set()
    for group in (data.get("groups") or {}).values():
        varied |= set(group) if isinstance(group, Mapping) else set()
    clash = sorted(k for k in (str(k).replace("-", "_") for k in overrides) if k in varied)
    if clash:
        raise ConfigError(
            f"sweep overrides: expected keys the grid does not set, got {clash} (the grid, its "
            "groups and the seeds give those values)"
        )
    return {**data, "base": {**(data.get("base") or {}), **overrides}}


def sweep(
    path_or_sweep: str | Path | Sweep | Mapping[str, Any],
    out: str | Path,
    shard: str | tuple[int, int] | None = None,
    *,
    seeds: str | Sequence[int] | None = None,
    force: bool = False,
    tracker: Tracker | None = None,
    track: Sequence[str] = (),
    track_dir: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
    track_experiment: str | None = None,
    argv: Sequence[str] | None = None,
    save_models: bool = False,
    claim: bool = False,
    progress: bool | None = None,
) -> SweepResult:
    """Run every point of a sweep grid into ``out``, like ``oneshotfl sweep``: one folder per
    run, and a run whose ``result.json`` exists is read back rather than run again (resume).

    Args:
        path_or_sweep: a sweep YAML file, its parsed mapping, or a
            :class:`~oneshotfl.runner.sweep.Sweep`.
        out: the results root.
        shard: run only shard ``K/N`` of the grid points (``"0/2"`` or ``(0, 2)``).
        seeds: run only these seeds (``"0,1"`` or ``[0, 1]``).
        force: run finished runs again.
        tracker: shows progress (default: as ``progress`` says).
        track: log each run it runs to these tracking backends, grouped under the sweep's
            name, as ``--track`` does.
        track_dir: the tracking directory (default ``runs/tensorboard``, ``runs/mlflow``).
        overrides: config keys applied to every point, on top of the file's (as
            ``oneshotfl sweep FILE key=value``).
        on_result: called with the run id and the result document of every run it runs.
        argv: how it was invoked, for its record (default: this call).
        track_experiment: the experiment (group) its tracked runs go under instead of the
            sweep's name.
        save_models: save every run's final models beside its ``result.json``.
        claim: with ``shard``, the shard's N processes claim grid points as they go (the
            next point nobody holds) rather than each taking every N-th; K names this
            process's record. Balanced where points differ in cost; see
            :class:`~oneshotfl.runner.sweep.PointClaims`.
        progress: without a ``tracker``, show progress bars on stderr as the command does
            (``None``: when stderr is a terminal or a notebook; ``False``: never).

    Every point it will run is checked before the first one trains (:func:`preflight`: the
    methods, names, requirements and graph), and a bad one is named. It writes the
    invocation's record (``sweep.json``, or ``sweep-shard-0of2.json`` …) as the
    command does, so ``oneshotfl report`` states its wall time.

    Raises:
        ConfigError: for a bad sweep file, shard or seed list, an unusable ``out``, or a
            tracking backend that is unknown or not installed.
    """
    if isinstance(path_or_sweep, Sweep):
        if overrides:
            raise ConfigError("overrides: expected a sweep file or mapping to apply them to")
        spec = path_or_sweep
    elif overrides:  # into the base, beneath every grid point: grid keys and seeds stay theirs
        spec = parse_sweep(with_base_overrides(path_or_sweep, overrides))
    elif isinstance(path_or_sweep, Mapping):
        spec = parse_sweep(path_or_sweep)
    else:
        spec = load_sweep(path_or_sweep)
    if seeds is not None and not isinstance(seeds, str):
        seeds = ",".join(str(s) for s in seeds)
    if isinstance(shard, tuple):
        shard = f"{shard[0]}/{shard[1]}"
    if claim and shard is None:
        raise ConfigError("--claim: expected --shard K/N beside it (K names this process)")
    runs = select_seeds(spec.runs, seeds)
    mine = select_shard(runs, shard)  # also checks the shard
    runs = runs if claim else mine
    root = writable_dir(Path(out))
    claims = PointClaims(root) if claim else None
    plans: dict[str, Plan] = {}
    done = {p.run_id: not force and _finished(root / p.run_id, p.config) for p in runs}
    for point in runs:  # every point checked before the first one trains
        if not done[point.run_id]:
            try:
                plans[point.run_id] = preflight(point.config)
            except ConfigError as exc:
                raise ConfigError(f"sweep point {point.run_id}: {exc}") from None
    results: dict[str, Result] = {}
    ran: list[str] = []
    start, began = time.perf_counter(), time.time()
    with shown_progress(tracker, progress) as shown:
        for i, point in enumerate(runs, 1):
            run_dir = root / point.run_id
            if done[point.run_id]:
                log.info("[%d/%d] %s: done already, read back", i, len(runs), point.run_id)
                results[point.run_id] = Result.load(run_dir)
                continue
            if claims is not None and not claims.take(point.point):
                log.info("[%d/%d] %s: another process has it", i, len(runs), point.run_id)
                continue
            if claims is not None and _finished_since(run_dir, point.config, began):
                # its claim was taken over from a process that finished it and exited
                log.info("[%d/%d] %s: finished by another process", i, len(runs), point.run_id)
                results[point.run_id] = Result.load(run_dir)
                continue
            log.info("[%d/%d] %s", i, len(runs), point.run_id)
            named = (track_experiment or spec.name, point.run_id)
            doc, path = run_and_write(
                plans.get(point.run_id) or preflight(point.config),
                run_dir,
                shown,
                track,
                track_dir,
                named,
                save_models,
            )
            results[point.run_id] = Result.from_dict(doc, path=path)
            ran.append(point.run_id)
            if on_result is not None:
                on_result(point.run_id, doc)
    call = (
        f"oneshotfl.sweep({spec.name!r}, out={str(root)!r}, shard={shard!r}, seeds={seeds!r}"
        f"{', claim=True' if claim else ''})"
    )
    write_sweep_record(
        root,
        spec.name,
        runs=len(runs),
        ran_now=len(ran),
        elapsed_s=time.perf_counter() - start,
        argv=list(argv) if argv is not None else [call],
        seeds=seeds,
        shard=shard,
    )
    return SweepResult(spec.name, root, results, tuple(ran))


def _finished_since(run_dir: Path, config: ExperimentConfig, since: float) -> bool:
    """Whether another process wrote this point's result (:func:`_finished`) at or after
    ``since`` (a wall-clock time): under ``--claim`` the points finished at the start are
    known, one finished since by a process that has exited is not run again."""
    try:
        fresh = (run_dir / RESULT_FILE).stat().st_mtime >= since
    except OSError:
        return False
    return fresh and _finished(run_dir, config)


def _finished(run_dir: Path, config: ExperimentConfig) -> bool:
    """Whether ``run_dir`` holds this point's result: a ``result.json`` of the same config
    (one of another — methods added to the grid since, a knob changed — is run again)."""
    path = run_dir / RESULT_FILE
    if not path.exists():
        return False
    try:
        stored = json.loads(path.read_text())
        changed = config_differences(stored, {"config": config.to_dict()}, ("then", "now"))
    except (OSError, ValueError, AttributeError, TypeError):
        log.warning("%s: unreadable, running it again", path)
        return False
    if changed:
        keys = ", ".join(d.split(":", 1)[0] for d in changed)
        log.warning("%s: its result.json ran another %s; running it again", run_dir.name, keys)
    return not changed
