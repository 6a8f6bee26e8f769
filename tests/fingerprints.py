"""Recorded payload fingerprints of every registered method (``tests/fingerprints.json``).

A fingerprint is, per client and per payload field, its dtype and shape and — for floats —
a few statistics (sum, |sum|, sum of squares, four sampled values), for everything else a
hash of its bytes; and the outcome's test accuracy. Floats are compared with a tolerance: a
change of seed stream, loss or recipe moves them by orders of magnitude more than float
kernels differ between CPUs, which is all the tolerance absorbs (the accuracy may move by a
few test images).

After a change that is *meant* to change what a method sends, re-record and review the diff::

    OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py            # all methods
    OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py fedol      # one method
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from helpers import TINY, prepare, run_over
from oneshotfl.devices import DeviceAudit, DeviceSlip
from oneshotfl.methods import METHODS, MethodSpec, build_method
from oneshotfl.payload import decode
from oneshotfl.protocol.contract import Method, PeerMethod
from oneshotfl.runner.config import ExperimentConfig, make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import Schedules
from oneshotfl.runner.transport import ClientReply, LocalTransport, Missing, PeerReport

RECORD = Path(__file__).with_name("fingerprints.json")


CONTRACT_PARAMS: dict[str, dict[str, Any]] = {
    # server-side synthesis at a budget that keeps the contract suite fast; the loop is the same
    "intactofl": {"rounds": 3, "generator_steps": 3, "batch_size": 32, "width": 4},
    "dense": {"rounds": 3, "generator_steps": 3, "batch_size": 32, "width": 4},
    "co_boosting": {"rounds": 3, "generator_steps": 3, "batch_size": 32, "width": 4},
    "f_adi": {"images": 32, "steps": 5, "distill_steps": 10},
    "f_dafl": {"rounds": 10, "batch_size": 32, "width": 4, "noise_dim": 16},
    "ma_echo": {"iterations": 5},
    "fens": {"rounds": 20, "eval_every": 10},
    **{f: {"kd_epochs": 1, "weight_steps": 20} for f in ("fol", "fol-a", "fol-n", "fol-an")},
    # server solvers and heads at a few hundred steps, not the papers' thousands: the same
    # code runs, the payload is unchanged, and each accuracy stays well above chance
    "fedpft": {"epochs": 1, "min_steps": 200, "lr": 0.03},  # the step floor still binds
    "fedage": {"block_epochs": 3, "ensemble_epochs": 5, "ensemble_lr_scale": 10.0},
    "pseudo_head": {"ensemble_epochs": 5, "ensemble_lr_scale": 10.0},
    "fedlpa": {"cg_steps": 100},  # conjugate gradients stop at the cap (261 at 1000)
    "fedd3": {"server_epochs": 50},
    "fedavg_rounds": {"rounds": 3},  # round 0, the payload recorded, is the same
    # the clients' part is the cost: fewer CVAE epochs, the true Fisher on two batches of 64
    "fedcvae": {"epochs": 3},
    "fedfisher": {"steps": 200, "fisher_examples": 128},
}
"""Hyper-parameters a method is checked with (default: its own defaults)."""


def contract_method(name: str) -> Method[Any]:
    """``name`` built with its :data:`CONTRACT_PARAMS`."""
    return build_method(MethodSpec(name, CONTRACT_PARAMS.get(name, {})))


def contract_config(name: str, **overrides: Any) -> ExperimentConfig:
    """The fixed digits federation a method's contract is checked on: 3 clients, one
    epoch, no disk cache, and whatever the method requires."""
    requires = METHODS.get(name).requires
    values: dict[str, Any] = {
        **TINY,
        "cache_dir": "",
        "server_epochs": 1,
        "val_fraction": 0.1,
        "methods": [name],
        "local_epochs": 2 if name == "fedeov_pruned" else 1,  # a pruning + a fine-tuning epoch
        "public_size": 100 if requires.public_data else 0,
        "server_model": "mlp" if requires.server_model else None,
        "encoder": "random:dim=16" if requires.shared_encoder else None,
    }
    values.update(overrides)
    return make_config(values)


@dataclass
class Recording:
    """A transport that keeps every client's round-0 wire bytes on the way through."""

    inner: LocalTransport
    sent: dict[int, bytes] = field(default_factory=dict)

    def upload(
        self, key: str, method: Method[Any], round_index: int, broadcast: bytes | None
    ) -> tuple[list[ClientReply], Missing]:
        replies, missing = self.inner.upload(key, method, round_index, broadcast)
        if round_index == 0:
            self.sent.update({r.client_id: r.data for r in replies})
        return replies, missing

    def relay(
        self,
        key: str,
        method: PeerMethod[Any],
        routes: Mapping[int, Mapping[int, bytes]],
        schedules: Schedules,
    ) -> tuple[list[PeerReport], Missing]:
        return self.inner.relay(key, method, routes, schedules)


SLIPS: dict[str, list[DeviceSlip]] = {}
"""Per method, the device slips its last audited :func:`contract_run` made."""


def contract_run(
    name: str, audit: bool = True
) -> tuple[dict[int, bytes], dict[str, Any], Federation]:
    """One run of ``name`` from scratch on :func:`contract_config`: every client's round-0
    wire bytes, the method's result entry, and the experiment it ran in. With ``audit`` the
    method runs under :class:`~oneshotfl.devices.DeviceAudit` and its slips land in
    :data:`SLIPS` (the audit only watches: the run is the same)."""
    exp = prepare(contract_config(name))
    transport = Recording(LocalTransport(exp))
    with DeviceAudit() if audit else contextlib.nullcontext() as watching:
        result = run_over(name, contract_method(name), exp, transport).to_dict()
    if isinstance(watching, DeviceAudit):
        SLIPS[name] = watching.slips
    return dict(transport.sent), result, exp


def fingerprint(data: bytes) -> dict[str, Any]:
    """The fingerprint of one payload's bytes (see the module docs)."""
    payload = decode(data)
    arrays: dict[str, Any] = {}
    for key, value in sorted(payload.arrays.items()):
        entry: dict[str, Any] = {"dtype": value.dtype.name, "shape": list(value.shape)}
        if value.dtype.kind == "f" and value.size:
            v = value.astype(np.float64).ravel()
            picks = np.linspace(0, v.size - 1, min(v.size, 4)).astype(int)
            entry["stats"] = [float(v.sum()), float(np.abs(v).sum()), float((v * v).sum())]
            entry["stats"] += [float(v[i]) for i in picks]
        else:
            entry["sha256"] = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        arrays[key] = entry
    return {"arrays": arrays, "scalars": dict(sorted(payload.scalars.items()))}


def differences(want: dict[str, Any], got: dict[str, Any], where: str) -> list[str]:
    """What differs between two fingerprints (floats within a relative 1e-4)."""
    if set(want["arrays"]) != set(got["arrays"]):
        return [f"{where}: fields {sorted(want['arrays'])} recorded, {sorted(got['arrays'])} now"]
    diffs = []
    for key, w in want["arrays"].items():
        g = got["arrays"][key]
        if {k: v for k, v in w.items() if k != "stats"} != {
            k: v for k, v in g.items() if k != "stats"
        }:
            diffs.append(f"{where}.{key}: {w} recorded, {g} now")
        elif "stats" in w:
            scale = max(1.0, abs(w["stats"][1]))
            if not np.allclose(g["stats"], w["stats"], rtol=1e-4, atol=1e-6 * scale):
                diffs.append(f"{where}.{key}: stats {w['stats']} recorded, {g['stats']} now")
    for key in sorted(set(want["scalars"]) | set(got["scalars"])):
        a, b = want["scalars"].get(key), got["scalars"].get(key)
        close = isinstance(a, float) and isinstance(b, float) and np.isclose(a, b, rtol=1e-4)
        if a != b and not close:
            diffs.append(f"{where}.{key}: {a!r} recorded, {b!r} now")
    return diffs


def record(names: list[str]) -> None:
    """Re-record ``names`` (all methods when empty) into :data:`RECORD`."""
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for name in names or METHODS.names():
        payloads, result, _ = contract_run(name)
        recorded[name] = {
            "clients": {str(c): fingerprint(data) for c, data in sorted(payloads.items())},
            "accuracy": result["accuracy"],
        }
        print(f"recorded {name}")
    recorded = {k: recorded[k] for k in sorted(recorded) if k in METHODS}
    RECORD.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record(sys.argv[1:])
