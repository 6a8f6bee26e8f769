"""The contract every registered method honours, checked over the whole registry on a fixed
digits federation (``fingerprints.contract_config``):

* its declaration: registered name, ``Requires``, a frozen ``Config``;
* its payload equals the recorded fingerprint (``tests/contract/<name>.json``);
* the context its receiver gets holds no other client's data, nor a route to another
  party's cached artefacts (a server's holds no client data at all);
* every requirement it declares is enforced before any training;
* a second run, from scratch, is bit-identical (payload bytes and every metric).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import typing
from typing import Any

import numpy as np
import pytest
import torch

from fingerprints import (
    SLIPS,
    contract_config,
    contract_run,
    declared_requires,
    differences,
    fingerprint,
    kernels,
    payload_differences,
    recorded,
)
from helpers import check, prepare
from oneshotfl.data.types import LabelledData
from oneshotfl.methods import METHODS, build_method
from oneshotfl.payload import Payload, decode, encode
from oneshotfl.protocol.contract import Method, PeerMethod, Requires, ServerContext, Topology
from oneshotfl.protocol.spec import PayloadSpec
from oneshotfl.runner.errors import RequirementError
from oneshotfl.training.artefacts import ArtefactStore

NAMES = METHODS.names()
first_run = functools.cache(contract_run)  # shared by the fingerprint and the identity test
SHARED = [pytest.param(n, marks=pytest.mark.xdist_group(f"contract-{n}")) for n in NAMES]
"""The methods, each one's tests that read :func:`first_run` kept on one xdist worker
(``--dist loadgroup``, pyproject.toml): the run is made once, not once per worker."""


@pytest.mark.parametrize("name", NAMES)
def test_declaration(name: str) -> None:
    cls = METHODS.get(name)
    assert issubclass(cls, Method) and cls.name == name
    assert isinstance(cls.requires, Requires)
    assert dataclasses.is_dataclass(cls.Config)
    config = cls.Config()
    field_names = [f.name for f in dataclasses.fields(cls.Config)]
    if field_names:  # frozen: hyper-parameters cannot change mid-run
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, field_names[0], None)
    assert (cls.__doc__ or "").strip(), "a method documents itself"


@pytest.mark.parametrize("name", NAMES)
def test_declared_needs_match_the_record(name: str) -> None:
    """A method's declared needs (images, a shared encoder, a public pool, ...) are pinned in
    its record: a change is deliberate, re-recorded with ``tests/fingerprints.py NAME``."""
    assert recorded(name)["requires"] == declared_requires(name)


@pytest.mark.parametrize("name", SHARED)
def test_payload_matches_the_recorded_fingerprint(name: str) -> None:
    record = recorded(name)  # none recorded: the error names the command that records it
    payloads, result, _ = first_run(name)
    diffs = payload_differences(record, payloads)
    assert not diffs, "\n".join(diffs[:10])
    assert result["accuracy"] == pytest.approx(record["accuracy"], abs=0.02)


@pytest.mark.parametrize("name", SHARED)
def test_every_tensor_it_makes_lands_on_the_runs_device(name: str) -> None:
    """Issue 34: a tensor made without a device (SimCLR's NT-Xent targets) sits on the CPU and
    fails a GPU run. The contract run is audited (``oneshotfl.devices.DeviceAudit``): no
    tensor the method's code makes without a device may meet the run's tensors."""
    first_run(name)
    assert not SLIPS[name], "\n".join(map(str, SLIPS[name]))


def _rows(x: torch.Tensor) -> set[bytes]:
    flat = x.detach().cpu().reshape(len(x), -1).contiguous().numpy()
    return {hashlib.sha256(r.tobytes()).digest() for r in flat}


def _reachable(obj: Any, seen: set[int] | None = None) -> list[Any]:
    """Every tensor, array and artefact store reachable from ``obj`` through dataclass fields
    (the stores' private memos and views included), modules and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor | np.ndarray):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict().values())
    found: list[Any] = [obj] if isinstance(obj, ArtefactStore) else []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items: list[Any] = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, list | tuple):
        items = list(obj)
    else:
        return found
    return found + [t for item in items for t in _reachable(item, seen)]


def _held_rows(obj: Any) -> set[bytes]:
    arrays = [
        torch.as_tensor(a) for a in _reachable(obj) if isinstance(a, torch.Tensor | np.ndarray)
    ]
    return set().union(*(_rows(t) for t in arrays if t.ndim > 1))


def test_the_server_context_has_no_field_for_client_data() -> None:
    hints = typing.get_type_hints(ServerContext)
    assert all("LabelledData" not in str(hint) for hint in hints.values())


@pytest.mark.parametrize("name", SHARED)
def test_the_receiver_holds_no_other_clients_data(name: str) -> None:
    _, _, exp = first_run(name)  # after a run: the caches are full
    clients = {c.client_id: _rows(c.train.x) for c in exp.data.clients}
    if METHODS.get(name).requires.topology is Topology.PEER:
        for receiver, own in clients.items():
            ctx = exp.client_context(receiver)
            held = _held_rows(ctx)
            others = set().union(*(rows for c, rows in clients.items() if c != receiver))
            assert own <= held and not held & others
            stores = [s for s in _reachable(ctx) if isinstance(s, ArtefactStore)]
            assert {s.scope for s in stores} == {f"client {receiver}"}
        return
    ctx = exp.server_view().server_context()
    assert not _held_rows(ctx) & set().union(*clients.values())
    assert not any(isinstance(v, LabelledData) for v in vars(ctx).values())
    stores = [s for s in _reachable(ctx) if isinstance(s, ArtefactStore)]
    assert {s.scope for s in stores} == {"server"}  # no route to any client's artefacts


def _lacking(name: str) -> dict[str, dict[str, Any]]:
    """For each requirement ``name`` declares: a config override that lacks it."""
    req = METHODS.get(name).requires
    lacks: dict[str, dict[str, Any]] = {}
    if req.public_data:
        lacks["public unlabelled pool"] = {"public_size": 0}
    if req.server_model:
        lacks["server architecture"] = {"server_model": None}
    if req.shared_encoder:
        lacks["shared frozen encoder"] = {"encoder": None}
    if req.same_architecture:
        lacks["identical client architectures"] = {"model": "mlp,cnn"}
    if req.min_clients > 1:
        lacks[f"at least {req.min_clients} clients"] = {"clients": req.min_clients - 1}
    return lacks


@pytest.mark.parametrize(
    ("name", "needs"), [(n, k) for n in NAMES for k in _lacking(n)] or [("local", "")]
)
def test_declared_requirements_are_enforced(name: str, needs: str) -> None:
    if not needs:
        pytest.skip("no method declares a requirement")
    exp = prepare(contract_config(name, **_lacking(name)[needs]))
    with pytest.raises(RequirementError, match=needs):
        check(exp, [(name, build_method(name))])


@pytest.mark.parametrize("name", SHARED)
def test_a_second_run_is_bit_identical(name: str) -> None:
    method = build_method(name)
    payloads_a, a, exp = first_run(name)
    assert isinstance(method.payload_spec(exp.dims), PayloadSpec)
    payloads_b, b, _ = contract_run(name, audit=False)  # fresh, unwatched: all recomputed
    assert payloads_a == payloads_b
    for doc in (a, b):  # diagnostics' "timings" are measured wall-clock facts, never compared
        diagnostics = doc.get("diagnostics", {})
        for part in (diagnostics, *diagnostics.values()):  # a peer method's: per receiver
            if isinstance(part, dict):
                part.pop("timings", None)
    for key in ("accuracy", "personal_accuracy", "per_class_accuracy", "client_accuracy",
                "upload_bytes_per_client", "local_test_accuracy", "local_val_accuracy",
                "topology", "diagnostics"):  # fmt: skip
        assert json.dumps(a.get(key), default=str) == json.dumps(b.get(key), default=str), key
    assert 0.0 <= a["accuracy"] <= 1.0 and a["rejected"] == {}
    assert a["clients_used"] == [0, 1, 2]
    uploads = a["upload_bytes_per_client"]
    if method.communicates and isinstance(method, PeerMethod):  # a schedule may meet no one
        assert sum(uploads) > 0
    else:
        assert (min(uploads) > 0) == method.communicates
    assert np.isfinite(a["personal_accuracy"])


@pytest.mark.xdist_group("contract-fedavg")  # reads fedavg's first_run
def test_fingerprints_see_a_real_change_and_forgive_float_noise() -> None:
    data = first_run("fedavg")[0][0]
    payload = decode(data)
    key = next(k for k, v in payload.arrays.items() if v.dtype.kind == "f" and v.size > 10)
    noisy, changed = dict(payload.arrays), dict(payload.arrays)
    noisy[key] = (payload.arrays[key] * np.float32(1 + 1e-6)).astype(np.float32)
    changed[key] = payload.arrays[key].copy()
    changed[key].flat[0] += 0.01
    base = fingerprint(data)
    assert not differences(base, fingerprint(encode(Payload(noisy, payload.scalars))), "c")
    assert differences(base, fingerprint(encode(Payload(changed, payload.scalars))), "c")
    fewer = Payload({k: v for k, v in payload.arrays.items() if k != key}, payload.scalars)
    assert differences(base, fingerprint(encode(fewer)), "c")


def test_a_digest_of_trained_weights_is_exact_only_under_the_kernels_it_was_recorded_on() -> None:
    """A SHA-256 of trained weights (FedSD2C's autoencoder) changes with the CPU's float
    kernels: compared exactly under the record's kernels, elsewhere by which clients share it."""
    a, b = "a" * 64, "b" * 64

    def sent(*digests: str) -> dict[int, bytes]:
        return {c: encode(Payload({}, {"autoencoder": d})) for c, d in enumerate(digests)}

    clients = {str(c): fingerprint(data) for c, data in sent(a, a).items()}
    here = {"clients": clients, "kernels": kernels()}
    elsewhere = {"clients": clients, "kernels": {**kernels(), "cpu_id": "another CPU"}}
    assert not payload_differences(here, sent(a, a))
    assert payload_differences(here, sent(b, b))  # the same kernels: another autoencoder
    assert not payload_differences(elsewhere, sent(b, b))  # other kernels: other bits
    assert not payload_differences({"clients": clients}, sent(b, b))  # a record not saying
    split = payload_differences(elsewhere, sent(a, b))  # two clients, two autoencoders
    assert split == [
        "autoencoder: clients [['0', '1']] shared a value when recorded, [['0'], ['1']] now"
    ]
    named = {
        str(c): fingerprint(data) for c, data in enumerate([encode(Payload({}, {"arch": "cnn"}))])
    }
    assert payload_differences({"clients": named}, {0: encode(Payload({}, {"arch": "mlp"}))})
