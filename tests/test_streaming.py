"""Streaming aggregation (issue 53, item 2): a server step that is a sum over clients folds
each payload as it is decoded, so n payloads are never held at once; the result is the same
bits as holding them all; a payload the fold refuses mid-stream rejects its client alone."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fingerprints import Recording
from helpers import TINY, prepare, run_over
from oneshotfl.functional import WeightedSum, weighted_average
from oneshotfl.methods import METHODS, build_method
from oneshotfl.methods.fedavg import FedAvg
from oneshotfl.methods.folds import ModelAverage
from oneshotfl.payload import Payload, decode
from oneshotfl.protocol.contract import ServerContext
from oneshotfl.protocol.fold import Fold, fold_all, uses_fold
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadError
from oneshotfl.runner import admission, transport
from oneshotfl.runner.admission import admitted_in_order
from oneshotfl.runner.config import ExperimentConfig
from oneshotfl.runner.transport import ClientReply, LocalTransport
from oneshotfl.training.artefacts import ArtefactStore, MemoBudget

FOLDING = [
    "fedavg",
    "fedavg:weighting=uniform",
    "fedprox",
    "fedavg_rounds:rounds=2",
    "regmean",
    "regmean:others=weighted",
    "fedfisher",
    "fedfisher:solver=closed",
    "ghofl",
    "ghofl:head=qda",
]
HOLDING = [
    "fedavg:weighting=clipped",
    "fedavg:aggregation=median",
    "regmean:weighting=clipped",
    "fedfisher:weighting=clipped",
    "fedfisher:curvature=kfac",
    "fedpft",
]


def _states(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {"w": rng.normal(size=(3, 4)).astype(np.float32), "steps": np.array(rng.integers(9))}
        for _ in range(n)
    ]


def test_weighted_sum_is_the_weighted_average_and_refuses_without_changing() -> None:
    states, weights = _states(0, 5), [3.0, 1.0, 0.0, 7.0, 2.5]
    expected = weighted_average(states, weights)
    summed = WeightedSum()
    for state, weight in zip(states, weights, strict=True):
        summed.add(state, weight)
    before = {k: v.copy() for k, v in summed.sums.items()}
    with pytest.raises(ValueError, match="expected shape"):
        summed.add({"w": np.zeros((4, 3), np.float32), "steps": np.array(1)}, 1.0)
    with pytest.raises(ValueError, match="non-negative weight"):
        summed.add(states[0], -1.0)
    assert all(np.array_equal(before[k], summed.sums[k]) for k in before)
    out = summed.mean()
    for key, value in expected.items():
        assert out[key].dtype == value.dtype and np.array_equal(out[key], value)
    reference = sum(w * s["w"].astype(np.float64) for s, w in zip(states, weights, strict=True))
    np.testing.assert_allclose(out["w"], reference / sum(weights), rtol=1e-6)
    with pytest.raises(ValueError, match="positive total weight"):
        WeightedSum().mean()


def _config(tmp_path: Path, methods: list[str], stream: bool) -> ExperimentConfig:
    return ExperimentConfig(
        **{**TINY, "clients": 5, "cache_dir": str(tmp_path / "cache")},
        encoder="random:dim=16",  # GH-OFL's and FedPFT's shared encoder
        methods=tuple(methods),
        hold_payloads=not stream,
    )


def _run(tmp_path: Path, key: str, stream: bool) -> tuple[Any, dict[str, torch.Tensor]]:
    fed = prepare(_config(tmp_path, [key], stream))
    seen: dict[str, Outcome] = {}
    method = build_method(key)
    original = method.aggregate

    def aggregate(payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        seen["outcome"] = original(payloads, ctx)
        return seen["outcome"]

    fold = method.fold

    def folding(ctx: ServerContext) -> Fold | None:
        inner = fold(ctx)
        if inner is None:
            return None

        class Spy(Fold):
            def add(self, client_id: int, payload: Payload) -> None:
                inner.add(client_id, payload)

            def finish(self) -> Outcome:
                seen["outcome"] = inner.finish()
                return seen["outcome"]

        return Spy()

    method.aggregate = aggregate  # type: ignore[method-assign]
    method.fold = folding  # type: ignore[method-assign]
    result = run_over(key, method, fed, LocalTransport(fed))
    outcome = seen["outcome"]
    assert isinstance(outcome, GlobalModel)
    return result, {k: v.clone() for k, v in outcome.model.state_dict().items()}


@pytest.mark.parametrize("key", FOLDING + HOLDING)
def test_streaming_gives_the_bits_of_holding_every_payload(tmp_path: Path, key: str) -> None:
    """The same model to the bit, the same accuracy, clients and bytes, with and without
    ``stream``; the methods that need every payload (clipped sizes, a median) hold them."""
    name = key.split(":")[0]
    assert (build_method(key).fold(_context(tmp_path)) is None) == (key in HOLDING)
    streamed, a = _run(tmp_path, key, stream=True)
    held, b = _run(tmp_path, key, stream=False)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert streamed.accuracy == held.accuracy
    assert streamed.clients_used == held.clients_used == list(range(5))
    assert streamed.upload_bytes_per_client == held.upload_bytes_per_client


def _context(tmp_path: Path) -> ServerContext:
    fed = prepare(_config(tmp_path, ["fedavg"], True))
    return fed.server_view().server_context()


class Alive:
    """Objects tracked by weak reference: ``len`` is how many are still alive."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[Any]] = []

    def add(self, obj: Any) -> None:
        self.refs.append(weakref.ref(obj))

    def __len__(self) -> int:
        return sum(ref() is not None for ref in self.refs)


def test_a_fold_holds_one_payload_and_one_reply_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the in-process transport and a fold, the server holds one decoded payload and
    one client's reply while it folds; without a fold, ``aggregate`` gets all five."""
    payloads, replies = Alive(), Alive()
    receive, update_on = admission.receive, transport.update_on

    def tracked_receive(*args: Any) -> Payload:
        payload = receive(*args)
        payloads.add(payload)
        return payload

    def tracked_update(*args: Any) -> Any:
        reply = update_on(*args)
        replies.add(reply)
        return reply

    monkeypatch.setattr(admission, "receive", tracked_receive)
    monkeypatch.setattr(transport, "update_on", tracked_update)
    held: list[tuple[int, int]] = []

    class Watched(FedAvg):
        def fold(self, ctx: ServerContext) -> Fold | None:
            inner = super().fold(ctx)
            assert inner is not None

            class Watch(Fold):
                def add(self, client_id: int, payload: Payload) -> None:
                    held.append((len(payloads), len(replies)))
                    inner.add(client_id, payload)

                def finish(self) -> Outcome:
                    return inner.finish()

            return Watch()

        def aggregate(self, payloads_: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
            held.append((len(payloads), len(replies)))
            return super().aggregate(payloads_, ctx)

    for stream in (True, False):
        held.clear()
        fed = prepare(_config(tmp_path, ["fedavg"], stream))
        run_over("fedavg", Watched(), fed, LocalTransport(fed))
        if stream:
            assert len(held) == 5 and max(held) == (1, 1), held
        else:
            assert held[0] == (5, 0), held  # every payload at once; the wire bytes released


def test_a_payload_the_fold_refuses_rejects_its_client_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    """A bad payload met mid-stream: its client is rejected and named, the run goes on, and
    the model is the average of the payloads folded before and after it."""

    class RefusesTwo(FedAvg):
        def fold(self, ctx: ServerContext) -> Fold | None:
            inner = super().fold(ctx)
            assert inner is not None

            class Refusing(Fold):
                def add(self, client_id: int, payload: Payload) -> None:
                    if client_id == 2:
                        raise PayloadError(
                            "model", "a model this server takes", "one it refuses", 2
                        )
                    inner.add(client_id, payload)

                def finish(self) -> Outcome:
                    return inner.finish()

            return Refusing()

    fed = prepare(_config(tmp_path, ["fedavg"], True))
    recording = Recording(LocalTransport(fed))
    outcomes: list[Outcome] = []
    method = RefusesTwo()
    fold = method.fold

    def keep(ctx: ServerContext) -> Fold | None:
        inner = fold(ctx)
        assert inner is not None

        class Keep(Fold):
            def add(self, client_id: int, payload: Payload) -> None:
                inner.add(client_id, payload)

            def finish(self) -> Outcome:
                outcomes.append(inner.finish())
                return outcomes[-1]

        return Keep()

    method.fold = keep  # type: ignore[method-assign]
    result = run_over("fedavg", method, fed, recording)
    assert result.clients_used == [0, 1, 3, 4]
    assert "client 2" in result.rejected["2"] and "refuses" in result.rejected["2"]
    others = {c: decode(recording.sent[c]) for c in (0, 1, 3, 4)}
    expected = fold_all(ModelAverage(fed.dims), others)
    assert isinstance(expected, GlobalModel) and isinstance(outcomes[0], GlobalModel)
    got, want = outcomes[0].model.state_dict(), expected.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_every_fold_of_the_registry_is_its_aggregate(tmp_path: Path) -> None:
    """Each registered method that offers a fold defines ``aggregate`` through it: folding
    the payloads one by one is the outcome ``aggregate`` returns (checked bit for bit above
    for the model averages); the methods without one are the ones that need every payload."""
    ctx = _context(tmp_path)
    folding = sorted(name for name in METHODS.names() if build_method(name).fold(ctx) is not None)
    expected = {"fedavg", "fedprox", "fedavg_rounds", "regmean", "fedfisher", "ghofl"}
    assert expected <= set(folding) and "fedpft" not in folding, folding


@pytest.mark.parametrize("name", ["fedavg", "regmean", "fedfisher"])
def test_clipped_weights_below_the_cap_merge_to_the_bits_of_size_weights(
    tmp_path: Path, name: str
) -> None:
    """``clipped`` caps n_k at twice the median: with reported sizes 10, 20, 20, 30 and 40
    (median 20, cap 40) no client is capped, and the held payloads are folded by the same
    code as ``size`` weights read one at a time, so the merge is the same to the bit."""
    fed = prepare(_config(tmp_path, [name], True))
    recording = Recording(LocalTransport(fed))
    run_over(name, build_method(name), fed, recording)
    sizes = dict(enumerate([10.0, 20.0, 20.0, 30.0, 40.0]))
    payloads = {}
    for cid, data in recording.sent.items():
        payload = decode(data)
        payloads[cid] = Payload(payload.arrays, {**payload.scalars, "n_examples": sizes[cid]})
    ctx = fed.server_view().server_context()
    merged = [
        build_method(f"{name}:weighting={w}").aggregate(payloads, ctx) for w in ("clipped", "size")
    ]
    assert all(isinstance(m, GlobalModel) for m in merged)
    a, b = (m.model.state_dict() for m in merged if isinstance(m, GlobalModel))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _artefact(size: int) -> Payload:
    return Payload({"w": np.zeros(size // 4, dtype=np.float32)})


def test_the_clients_memos_are_bounded_least_recently_used_first(tmp_path: Path) -> None:
    """Past the budget, the least recently used client's memo is dropped as a new view is
    handed out: its artefact is made again (no disk cache) or read from disk; the server's,
    the newest client's and a client holding an offered artefact are kept."""
    for root in (None, tmp_path / "cache"):
        store = ArtefactStore(root, budget=MemoBudget(limit=3000))
        made: list[int] = []

        def make(made: list[int], cid: int) -> Payload:
            made.append(cid)
            return _artefact(1000)

        store.scoped("server").get_or_make("model", {"c": -1}, lambda: _artefact(5000), "s")
        store.scoped("client 9").offer("model", {"c": 9}, _artefact(1000), 0.1)
        for cid in range(6):
            view = store.scoped(f"client {cid}")
            view.get_or_make(
                "model", {"c": cid}, functools.partial(make, made, cid), f"client {cid}"
            )
            assert store.budget.held <= 3000 + 1000  # at most one client past the bound
        assert "client 9" in store._views and "server" in store._views
        assert made == list(range(6))
        store.scoped("client 0").get_or_make(
            "model", {"c": 0}, functools.partial(make, made, 0), "c0"
        )
        assert made[-1] == 0 if root is None else made == list(range(6))  # made again / read
        assert store.counts.from_disk == (0 if root is None else 1)
        store.scoped("client 5").get_or_make(
            "model", {"c": 5}, functools.partial(make, made, 5), "c5"
        )
        assert made.count(5) == 1  # recently used: still in memory
    unbounded = ArtefactStore(None)
    for cid in range(6):
        unbounded.scoped(f"client {cid}").get_or_make("m", {"c": cid}, lambda: _artefact(1000), "")
    assert len(unbounded._views) == 6 and unbounded.budget.held == 6000


def test_a_run_past_its_memo_budget_gives_the_same_results(tmp_path: Path) -> None:
    """Two methods over 20 clients, no disk cache: with a 1 MB budget the second method
    trains the clients the budget dropped again, and every result is the same."""
    from helpers import run_config

    results = []
    for memo in (0, 1):
        cfg = ExperimentConfig(
            **{**TINY, "clients": 20, "min_samples": 2, "cache_dir": None},
            methods=("fedavg", "ensemble"),
            memo_mb=memo,
        )
        results.append(run_config(cfg))
    unbounded, bounded = ({m["key"]: m for m in r["methods"]} for r in results)
    for key in ("fedavg", "ensemble"):
        assert bounded[key]["accuracy"] == unbounded[key]["accuracy"], key
        assert bounded[key]["per_class_accuracy"] == unbounded[key]["per_class_accuracy"]
    unbounded, bounded = results
    assert bounded["cache"]["misses"] > unbounded["cache"]["misses"], bounded["cache"]


def test_a_subclass_that_overrides_aggregate_alone_keeps_it(tmp_path: Path) -> None:
    """A plugin that adds a step to FedAvg's ``aggregate`` (and no fold) gets its
    ``aggregate`` called with every payload: the inherited fold does not bypass it."""
    called: list[list[int]] = []

    class Plus(FedAvg):
        def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
            called.append(sorted(payloads))
            return super().aggregate(payloads, ctx)

    assert uses_fold(FedAvg()) and not uses_fold(Plus())
    fed = prepare(_config(tmp_path, ["fedavg"], True))
    run_over("fedavg", Plus(), fed, LocalTransport(fed))
    assert called == [list(range(5))]


def test_of_two_replies_from_one_client_the_first_is_admitted() -> None:
    first, other, second = (
        ClientReply(0, b"first", 1.0),
        ClientReply(1, b"other", 1.0),
        ClientReply(0, b"second", 1.0),
    )
    for replies in ([first, other, second], (first, other, second)):
        dropped: dict[str, str] = {}
        got = list(admitted_in_order("fedavg", replies, 2, dropped))
        assert [r.data for r in got] == [b"first", b"other"], replies
        assert "a second reply" in dropped["client 0"]
    with pytest.raises(RuntimeError, match="out of order"):
        list(admitted_in_order("fedavg", iter([other, first]), 2, {}))
