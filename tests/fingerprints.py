"""Recorded payload fingerprints of every registered method, one file each
(``tests/contract/<name>.json``, with the hyper-parameters the method is checked with).

A fingerprint is, per client and per payload field, its dtype and shape and — for floats —
a few statistics (sum, |sum|, sum of squares, four sampled values), for everything else a
hash of its bytes; and the outcome's test accuracy. Floats are compared with a tolerance: a
change of seed stream, loss or recipe moves them by orders of magnitude more than float
kernels differ between CPUs, which is all the tolerance absorbs (the accuracy may move by a
few test images). A record names the float kernels it was made under (CPU, instruction set,
torch, threads); a digest a method sends of trained weights (FedSD2C's autoencoder) is
compared exactly only under those, and elsewhere by which clients share it.

After a change that is *meant* to change what a method sends, re-record and review the diff::

    OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py            # all methods
    OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py fedol      # one method

A new method records its own file with the same command; where the contract should check it at
a smaller budget than its defaults, name the parameters once (they are kept on re-recording)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py mymethod epochs=3 --why "…"
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from helpers import TINY, prepare, run_over
from oneshotfl.devices import DeviceAudit, DeviceSlip
from oneshotfl.environment import kernel_differences, kernel_signature
from oneshotfl.methods import METHODS, MethodSpec, build_method
from oneshotfl.payload import decode
from oneshotfl.protocol.contract import Method, PeerMethod
from oneshotfl.runner.config import ExperimentConfig, make_config
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import Schedules
from oneshotfl.runner.transport import ClientReply, LocalTransport, Missing, PeerReport

RECORDS = Path(__file__).with_name("contract")
"""One file per method, ``contract/<name>.json`` (:func:`recorded`): a new method adds its
own, written by this module's command; no shared file to edit."""


def recorded(name: str) -> dict[str, Any]:
    """``name``'s record (:data:`RECORDS`): ``params``, the hyper-parameters it is checked
    with (its own defaults where empty) and ``why`` they differ from its defaults; what it
    declares it needs (``requires``); the fingerprint of each client's payload (``clients``)
    and the outcome's ``accuracy``.

    Raises:
        FileNotFoundError: when none is recorded, naming the command that records it.
    """
    path = RECORDS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no contract record for method {name!r} ({path}): record it with"
            f" OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py {name}"
        )
    record = dict(json.loads(path.read_text()))
    if "clients" not in record:  # a recording that did not finish
        raise FileNotFoundError(
            f"the contract record of {name!r} ({path}) holds no fingerprint: record it with"
            f" OMP_NUM_THREADS=1 .venv/bin/python tests/fingerprints.py {name}"
        )
    return record


def declared_requires(name: str) -> dict[str, Any]:
    """What ``name`` declares it needs (its :class:`~oneshotfl.protocol.contract.Requires`), as
    its record holds it: a change of a method's declared needs is seen and re-recorded."""
    req = METHODS.get(name).requires
    values = {f.name: getattr(req, f.name) for f in dataclasses.fields(req)}
    return {k: getattr(v, "value", v) for k, v in values.items()}


def contract_params(name: str) -> dict[str, Any]:
    """The hyper-parameters ``name`` is checked with (empty: its defaults)."""
    path = RECORDS / f"{name}.json"
    return dict(json.loads(path.read_text()).get("params", {})) if path.exists() else {}


def contract_method(name: str) -> Method[Any]:
    """``name`` built with its :func:`contract_params`."""
    return build_method(MethodSpec(name, contract_params(name)))


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
        got, missing = self.inner.upload(key, method, round_index, broadcast)
        replies = list(got)  # every client run now (the in-process transport yields them)
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


DIGEST = re.compile(r"[0-9a-f]{64}")
"""A scalar of this form is a SHA-256 digest — of trained weights where a method sends one
(FedSD2C's autoencoder): the same only under the same float kernels."""


def kernels() -> dict[str, Any]:
    """The float kernels a record is made under (:data:`~oneshotfl.environment.KERNEL_KEYS`)."""
    return kernel_signature("cpu")


def differences(
    want: dict[str, Any], got: dict[str, Any], where: str, exact_digests: bool = True
) -> list[str]:
    """What differs between two fingerprints (floats within a relative 1e-4). A digest
    scalar (:data:`DIGEST`) is compared exactly only with ``exact_digests`` (the record made
    under these kernels); otherwise only its form, and :func:`payload_differences` checks
    which clients share it."""
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
        digests = all(isinstance(v, str) and DIGEST.fullmatch(v) for v in (a, b))
        if a != b and not close and not (digests and not exact_digests):
            diffs.append(f"{where}.{key}: {a!r} recorded, {b!r} now")
    return diffs


def payload_differences(record: Mapping[str, Any], payloads: Mapping[int, bytes]) -> list[str]:
    """What differs between a record's client fingerprints and these round-0 payloads (a
    different set of clients included). Under other float kernels than the record's (or a
    record that does not say), a digest scalar need not be the recorded one, but the clients
    that shared one must share one still."""
    want = record["clients"]
    if sorted(want) != [str(c) for c in sorted(payloads)]:
        return [f"clients {sorted(want)} recorded, {sorted(payloads)} now"]
    exact = not kernel_differences(record.get("kernels", {}), kernels())
    got = {str(c): fingerprint(data) for c, data in sorted(payloads.items())}
    lines = [
        line
        for c in sorted(payloads)
        for line in differences(want[str(c)], got[str(c)], f"client {c}", exact)
    ]
    for key in sorted({k for w in want.values() for k in w["scalars"]}):
        before = _groups({c: w["scalars"].get(key) for c, w in want.items()})
        after = _groups({c: g["scalars"].get(key) for c, g in got.items()})
        if before != after:
            lines.append(f"{key}: clients {before} shared a value when recorded, {after} now")
    return lines


def _groups(values: Mapping[str, Any]) -> list[list[str]]:
    """The clients grouped by the value they hold (which clients share one)."""
    groups: dict[str, list[str]] = {}
    for client, value in sorted(values.items()):
        groups.setdefault(json.dumps(value, sort_keys=True), []).append(client)
    return sorted(groups.values())


def record(names: list[str], params: dict[str, str] | None = None, why: str = "") -> None:
    """Re-record ``names`` (every registered method when empty), each into its own
    ``contract/<name>.json``, keeping the ``params`` and ``why`` recorded before unless new
    ones are given (one method only); a record whose method is no longer registered is
    removed."""
    if params and len(names) != 1:
        raise SystemExit("fingerprints: key=value parameters need exactly one method name")
    RECORDS.mkdir(exist_ok=True)
    for name in names or METHODS.names():
        METHODS.get(name)  # an unknown name: the registry's error, listing the known ones
        path = RECORDS / f"{name}.json"
        before = json.loads(path.read_text()) if path.exists() else {}
        entry: dict[str, Any] = {"params": before.get("params", {})}
        entry["requires"] = declared_requires(name)
        if params is not None:
            entry["params"] = dict(params)
        if why or before.get("why"):
            entry["why"] = why or before["why"]
        if params is not None:  # the run reads its parameters from the record
            path.write_text(json.dumps({**before, **entry}, indent=1, sort_keys=True) + "\n")
        payloads, result, _ = contract_run(name)
        entry["clients"] = {str(c): fingerprint(data) for c, data in sorted(payloads.items())}
        entry["accuracy"] = result["accuracy"]
        entry["kernels"] = kernels()  # digests are compared exactly under these only
        path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
        print(f"recorded {name} -> {path}")
    if not names:
        for stale in sorted(set(p.stem for p in RECORDS.glob("*.json")) - set(METHODS.names())):
            (RECORDS / f"{stale}.json").unlink()
            print(f"removed {stale}: no longer registered")


def main(argv: list[str]) -> None:
    """``fingerprints.py [NAME ...]``, or ``fingerprints.py NAME key=value ... [--why TEXT]``
    for a method checked with parameters other than its defaults."""
    why = ""
    if "--why" in argv:
        at = argv.index("--why")
        why, argv = " ".join(argv[at + 1 : at + 2]), argv[:at] + argv[at + 2 :]
    names = [a for a in argv if "=" not in a]
    pairs = [a.split("=", 1) for a in argv if "=" in a]
    try:
        record(names, {k: _value(v) for k, v in pairs} if pairs else None, why)
    except KeyError as exc:  # an unknown method: the registry's one line, listing the known
        raise SystemExit(f"fingerprints: {exc}") from None


def _value(text: str) -> Any:
    """A command-line value as JSON holds it (``3`` → 3, ``0.03`` → 0.03, ``true`` → True)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


if __name__ == "__main__":
    main(sys.argv[1:])
