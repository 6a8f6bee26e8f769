"""Sweeps: a grid of experiment configs run one after another, resumable.

A sweep file is YAML::

    name: core-fmnist
    base: {dataset: fashion_mnist, clients: 10, methods: [local, fedavg]}
    grid:                      # a list of sub-grids; in each, list values are crossed
      - {partition: dirichlet, alpha: [0.05, 0.1, 0.5]}
      - {partition: pathological, classes_per_client: 2}
    seeds: [0, 1, 2]
    groups:                    # optional: every grid point runs once per group
      models: {model: cnn, methods: [fedavg, fedprox]}
      predictions: {model: "cnn,mlp", server_model: fedavg_cnn, methods: [fedol]}

Groups are federations that belong in one table although they differ (FedOL's Table I runs
parameter-sharing methods on identical client models and prediction-sharing methods on
heterogeneous ones): each group's overrides apply on top of ``base`` and the grid point, the
run records ``group=<name>``, and the report treats the groups of one grid point as one
setting (a method that appears in several groups gets the group in its row name).

``claim_seeds`` adds seeds at which only some methods run (a claim's pair where the whole sweep
is too heavy to repeat; issue 51)::

    claim_seeds:
      seeds: [3, 4]
      methods: [fedage, fedcvae]               # with groups: {models: [fedavg], predictions: [...]}
      grid: [{psi: [0.7, 0.1], graph: ring}]   # optional: the grid points these seeds run

Every method named must be one the full seeds run in that group (the same spec string); a
group not named does not run at these seeds. A method's result never depends on which other
methods share its run (every random stream is derived from the seed and the method's own
names), so these runs pair seed by seed with the full ones.

Every run writes its own directory named after its grid values; a run whose ``result.json``
exists is skipped, so an interrupted sweep resumes where it stopped. Several processes share a
sweep either by shard (``--shard K/N``: every N-th grid point) or, with ``--claim`` beside
``--shard``, by claiming points as they go (:class:`PointClaims`), which keeps the cores busy
when points differ in cost. Runs go seed by seed
(every grid point with the first seed, then the next seed), so a sweep stopped early has
already covered every setting.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oneshotfl.runner.config import ConfigError, ExperimentConfig, make_config
from oneshotfl.runner.files import atomic_write_text


@dataclass(frozen=True)
class SweepRun:
    """One point of the grid."""

    run_id: str
    config: ExperimentConfig
    point: int = 0


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file."""

    name: str
    runs: tuple[SweepRun, ...]


def _expand(subgrid: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    keys = list(subgrid)
    values = [v if isinstance(v, list) else [v] for v in subgrid.values()]
    for combo in itertools.product(*values):
        yield dict(zip(keys, combo, strict=True))


def _run_id(point: Mapping[str, Any]) -> str:
    text = "_".join(f"{k}={v}" for k, v in point.items())
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "-", text)


def parse_sweep(data: Mapping[str, Any], default_name: str = "sweep") -> Sweep:
    """Expand a sweep mapping into runs (configs are validated here, before any run)."""
    unknown = sorted(set(data) - {"name", "base", "grid", "seeds", "groups", "claim_seeds"})
    if unknown:
        raise ConfigError(
            f"sweep: unknown key(s) {unknown}; expected name, base, grid, seeds, groups,"
            " claim_seeds"
        )
    groups = data.get("groups") or {"": {}}
    if not isinstance(groups, Mapping) or not all(isinstance(v, Mapping) for v in groups.values()):
        raise ConfigError(f"sweep: groups must map names to overrides, got {groups!r}")
    base = dict(data.get("base") or {})
    grid = data.get("grid") or [{}]
    if isinstance(grid, Mapping):
        grid = [grid]
    seeds = data.get("seeds", [base.get("seed", 0)])
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"sweep: seeds must be a list of integers, got {seeds!r}")
    runs, seen = [], set()
    points = [point for subgrid in grid for point in _expand(subgrid)]
    plan: list[tuple[int, list[dict[str, Any]] | None, dict[str, list[str]] | None]]
    plan = [(seed, None, None) for seed in seeds]
    plan += _claim_plan(data.get("claim_seeds"), seeds, points, base, groups)
    for seed, only_points, only_methods in plan:  # seed-major: a partial sweep covers every point
        for index, point in enumerate(points):
            if only_points is not None and point not in only_points:
                continue
            for group, full_overrides in groups.items():
                overrides = dict(full_overrides)
                if only_methods is not None:
                    if group not in only_methods:
                        continue
                    overrides["methods"] = only_methods[group]
                full = {**point, "seed": seed}
                labelled = {"group": group, **full} if group else full
                run_id = _run_id(labelled)
                if run_id in seen:
                    raise ConfigError(f"sweep: grid point {run_id} appears twice")
                seen.add(run_id)
                values = {**base, **point, **overrides, "seed": seed}
                if group:
                    values["group"] = str(group)
                runs.append(SweepRun(run_id, make_config(values), index + len(points) * seed))
    return Sweep(str(data.get("name", default_name)), tuple(runs))


def _claim_plan(
    spec: Any,
    seeds: list[int],
    points: list[dict[str, Any]],
    base: Mapping[str, Any],
    groups: Mapping[str, Any],
) -> list[tuple[int, list[dict[str, Any]], dict[str, list[str]]]]:
    """``claim_seeds`` (module docs) as (seed, the grid points it runs, group → methods)."""
    if spec is None:
        return []
    if not isinstance(spec, Mapping) or set(spec) - {"seeds", "methods", "grid"}:
        raise ConfigError(
            f"sweep: claim_seeds: expected a mapping of seeds, methods and grid, got {spec!r}"
        )
    extra = spec.get("seeds")
    if (
        not isinstance(extra, list)
        or not extra
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in extra)
    ):
        raise ConfigError(f"sweep: claim_seeds.seeds: expected a list of integers, got {extra!r}")
    if set(extra) & set(seeds):
        raise ConfigError(
            f"sweep: claim_seeds.seeds: expected seeds the sweep does not run in full ({seeds}),"
            f" got {extra}"
        )
    wanted = spec.get("methods")
    if isinstance(wanted, list):
        wanted = {group: wanted for group in groups} if list(groups) == [""] else wanted
    if not isinstance(wanted, Mapping) or not wanted:
        raise ConfigError(
            "sweep: claim_seeds.methods: expected a list of methods (or, with groups, a"
            f" mapping of group to methods), got {spec.get('methods')!r}"
        )
    only: dict[str, list[str]] = {}
    for group, specs in wanted.items():
        if group not in groups:
            raise ConfigError(
                f"sweep: claim_seeds.methods: expected groups among {sorted(groups)}, got {group!r}"
            )
        full = [str(m).strip() for m in groups[group].get("methods", base.get("methods")) or []]
        if not isinstance(specs, list):
            raise ConfigError(
                f"sweep: claim_seeds.methods{f' of group {group}' if group else ''}: expected a"
                f" list of methods, got {specs!r}"
            )
        chosen = [str(m).strip() for m in specs]
        stray = [m for m in chosen if m not in full]
        if not chosen or stray:
            raise ConfigError(
                f"sweep: claim_seeds.methods{f' of group {group}' if group else ''}: expected"
                f" some of {full}, got {stray or chosen}"
            )
        only[str(group)] = chosen
    grid = spec.get("grid")
    chosen_points = points
    if grid is not None:
        subgrids = [grid] if isinstance(grid, Mapping) else grid
        if not isinstance(subgrids, list) or not all(isinstance(g, Mapping) for g in subgrids):
            raise ConfigError(
                f"sweep: claim_seeds.grid: expected a mapping or a list of mappings, got {grid!r}"
            )
        chosen_points = [p for sub in subgrids for p in _expand(sub)]
        stray_points = [p for p in chosen_points if p not in points]
        if stray_points:
            raise ConfigError(
                f"sweep: claim_seeds.grid: expected points of the sweep's grid, got {stray_points}"
            )
    return [(seed, chosen_points, only) for seed in extra]


def sweep_mapping(path: str | Path) -> dict[str, Any]:
    """A sweep YAML file's mapping (named after the file unless it names itself)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"sweep file {path} does not exist") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"sweep file {path}: expected a mapping, got {type(data).__name__}")
    return {"name": path.stem, **data}


def load_sweep(path: str | Path) -> Sweep:
    """Read and expand a sweep YAML file."""
    return parse_sweep(sweep_mapping(path))


def select_seeds(runs: tuple[SweepRun, ...], seeds: str | None) -> tuple[SweepRun, ...]:
    """The runs whose seed is in the comma-separated ``seeds`` (all runs when ``None``).

    Raises:
        ConfigError: for a malformed list or a seed the sweep does not have.
    """
    if seeds is None:
        return runs
    try:
        wanted = {int(s) for s in seeds.split(",") if s.strip()}
    except ValueError:
        raise ConfigError(f"--seeds: expected comma-separated integers, got {seeds!r}") from None
    have = {run.config.seed for run in runs}
    missing = sorted(wanted - have)
    if not wanted or missing:
        raise ConfigError(f"--seeds: expected some of {sorted(have)}, got {seeds!r}")
    return tuple(run for run in runs if run.config.seed in wanted)


def select_shard(runs: tuple[SweepRun, ...], shard: str | None) -> tuple[SweepRun, ...]:
    """Shard ``K/N`` of the runs: the grid points (with every group of a point, so a point's
    groups share cached client models in one process) whose index is K modulo N.

    Raises:
        ConfigError: for a malformed shard or K outside 0…N−1.
    """
    if shard is None:
        return runs
    try:
        k, n = (int(v) for v in shard.split("/"))
    except ValueError:
        raise ConfigError(f"--shard: expected K/N such as 0/2, got {shard!r}") from None
    if not 0 <= k < n:
        raise ConfigError(f"--shard: expected 0 <= K < N, got {shard!r}")
    return tuple(run for run in runs if run.point % n == k)


@dataclass
class PointClaims:
    """Grid points claimed by the sweep processes that share one results folder (``--claim``).

    A process claims a point (every group of it) before running it: it writes its host, pid
    and a token of its own into a folder of its own and renames that folder to
    ``ROOT/.claims/point-<index>`` (atomic: exactly one process gets it, and a claim is never
    seen without its owner). A point another live process holds is left to it. A claim whose
    process is gone (same host, that pid no longer running) is taken over, so a sweep that
    crashed resumes, as is a claim folder without an owner (left by an older version that
    died between creating the folder and writing into it); a claim from another host is
    always left alone.
    """

    root: Path
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    def take(self, point: int) -> bool:
        """Claim ``point``; ``True`` when this process holds it (now or already)."""
        path = self.root / ".claims" / f"point-{point}"
        path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # again after taking over a dead process's claim, or a vanished one
            if self._place(path):
                return True
            owner = self._owner(path)
            if owner is None:  # taken over and removed meanwhile: try again
                continue
            if owner.get("token") == self.token:
                return True
            if owner.get("host") != socket.gethostname() or _alive(owner.get("pid")):
                return False
            stale = path.with_name(f"{path.name}.stale-{self.token}")
            try:  # atomic: of several processes taking over, one renames it away
                path.rename(stale)
            except OSError:
                return False
            shutil.rmtree(stale, True)
        return False

    def _place(self, path: Path) -> bool:
        """Put this process's claim at ``path`` unless a claim with an owner is there (an
        empty folder, an orphan, is replaced by the rename)."""
        staging = path.with_name(f"{path.name}.new-{self.token}")
        staging.mkdir(exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token}
        atomic_write_text(staging / "owner.json", json.dumps(me) + "\n")
        try:
            staging.rename(path)
        except OSError:  # a claim is there
            shutil.rmtree(staging, True)
            return False
        return True

    @staticmethod
    def _owner(path: Path) -> dict[str, Any] | None:
        """Who holds a claim (None: no claim there any more); a claim folder without a
        readable owner is an orphan, held by no live process of this host."""
        if not path.exists():
            return None
        try:
            owner = json.loads((path / "owner.json").read_text())
        except (OSError, ValueError):
            owner = None
        return owner if isinstance(owner, dict) else {"host": socket.gethostname(), "pid": None}


def _alive(pid: object) -> bool:
    """Whether process ``pid`` runs on this host (a malformed pid counts as gone)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_sweep_record(
    root: Path,
    name: str,
    *,
    runs: int,
    ran_now: int,
    elapsed_s: float,
    argv: list[str],
    seeds: str | None = None,
    shard: str | None = None,
) -> Path:
    """Write what one sweep invocation did (``sweep.json``, or ``sweep-seeds-0_shard-1of2.json``
    for a seed or shard selection) into ``root``; the report reads the wall times back. An
    invocation that ran nothing (the sweep was finished) keeps the record already there.

    Args:
        root: the sweep's results root.
        name: the sweep's name.
        runs: grid points selected by this invocation.
        ran_now: how many of them it ran (the others were finished already).
        elapsed_s: its wall time in seconds.
        argv: how it was invoked (command arguments, or the API call).
        seeds: the seed selection, as given (``"0,1"``).
        shard: the shard selection, as given (``"1/2"``).
    """
    meta = {
        "name": name,
        "runs": runs,
        "ran_now": ran_now,
        "wall_time_s_this_invocation": elapsed_s,
        "argv": argv,
    }
    parts = [f"seeds-{seeds.replace(',', '-')}" if seeds else "", f"shard-{shard}" if shard else ""]
    suffix = "_".join(part.replace("/", "of") for part in parts if part)
    path = root / (f"sweep-{suffix}.json" if suffix else "sweep.json")
    if ran_now == 0 and path.exists():  # a re-run of a finished sweep keeps its record
        return path
    atomic_write_text(path, json.dumps(meta, indent=2) + "\n")
    return path
