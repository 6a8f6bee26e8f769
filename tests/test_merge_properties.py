"""Properties every weight-merging method has, whatever its solver (issue 51, part 4):

* **one client merges to itself**: a federation of one gets that client's model back;
* **n identical clients merge to their model**: three clients that send the same model and the
  same statistics (as clients with the same data would) get that model back, whether they
  report the same size or different ones (the shares p_k then differ, the answer must not);
* on an MLP, the registered LeNet ``cnn`` and ``simple_cnn2`` (BatchNorm after every layer):
  FedLPA's and FedFisher's K-FAC merges on convolutions, RegMean beside BatchNorm.

Each method is driven as a run drives it: the real client step (local training, then the
method's statistics) on a tiny digits federation, the payload through the wire (encoded,
decoded and validated against the method's spec), then the server's ``aggregate``. Every
tensor of the merged model (parameters and buffers) must lie within the case's tolerance of
the client's: ``|merged − own|∞ ≤ rtol · max(|own|∞, 1)`` per tensor, integer buffers exactly.
Why each tolerance is what it is is said beside it in :data:`CASES`. So that the comparison
itself can fail, two *different* clients must merge to something measurably far from
either (:func:`test_two_different_clients_do_not_merge_to_either_one`).

Two merges failed these properties and were fixed. RegMean's pseudo-inverse set W to 0 along
every input direction no client's data span (a dead unit's column; with α = 1 also the
difference of two always-equal pixels), so even a lone client lost weights up to 0.7 of its
largest (:func:`test_regmean_keeps_the_average_where_no_client_activates_an_input`).
MA-Echo averaged in float32, and its normalised echo step (the code's CIFAR preset) turned the
ulp by which (w + w + w) / 3 can miss w into steps of length λ, 0.4% of the largest weight
after 60 iterations (:func:`test_ma_echo_averages_equal_clients_to_exactly_their_weights`).
MA-Echo needs no weaker property than the others: clients that agree are a fixed point of its
consensus and echo steps whatever their projections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from helpers import TINY, prepare
from oneshotfl.functional import ma_echo_consensus_step
from oneshotfl.methods import build_method
from oneshotfl.methods.ma_echo import _class_split_average
from oneshotfl.methods.regmean import regmean_weight
from oneshotfl.payload import Payload, decode, encode
from oneshotfl.protocol.contract import Method
from oneshotfl.protocol.outcome import GlobalModel
from oneshotfl.protocol.validate import validate_payload
from oneshotfl.runner.config import make_config
from oneshotfl.runner.federation import Federation

ARCHS = ("mlp", "cnn", "simple_cnn2")
"""The MLP, LeNet-5 (convolutions) and a CNN with BatchNorm."""

FLOAT32 = 1e-6
"""A few float32 ulps (ε = 1.2e-7) of the largest entry: what a float64 computation that is
exact in exact arithmetic keeps after its result is rounded back to float32. (Measured on
this file's models: every merge is bit-exact but FedLPA's, within 1e-13 of the largest
entry: 1 ulp of entries near 0.)"""


@dataclass(frozen=True)
class Case:
    """A method spec and the tolerance its merge of identical clients is held to."""

    spec: str
    rtol: float
    why: str

    @property
    def id(self) -> str:
        return self.spec.replace(":", "-")


CASES = (
    Case(
        "fedavg",
        FLOAT32,
        "Σ p_k w in float64 with Σ p_k = 1, rounded to float32 (exact for one client)",
    ),
    Case(
        "fedfisher:fisher_examples=64:steps=200",
        FLOAT32,
        "the Adam-like server starts at FedAvg, where the gradient F·w − b is float64 rounding "
        "(~1e-16·|F||w|); a step moves at most η·|m|/ε ≈ 10·|g|, so T steps drift by about "
        "T·1e-15: 200 here (the contract's budget), and 2000 (the default) stay below an ulp",
    ),
    Case(
        "fedfisher:fisher_examples=64:solver=closed",
        FLOAT32,
        "b / F = Σ p_k F_k w / Σ p_k F_k in float64 (FedAvg where F ≤ floor): one rounding",
    ),
    Case(
        "fedfisher:fisher_examples=64:curvature=kfac:steps=100",
        FLOAT32,
        "as the diagonal's Adam: FedAvg is the minimum, the gradient T(M) − Z is float64 "
        "rounding, a step (ε inside the root: η·|m|/√ε ≈ |g|) far below an ulp at any T",
    ),
    Case(
        "fedfisher:fisher_examples=64:curvature=kfac:solver=closed:steps=50",
        FLOAT32,
        "conjugate gradients from FedAvg: the residual Z − T(M) is already below cg's "
        "1e-8·‖Z‖, so no step is taken, whatever the cap (50 here, for the different "
        "clients' merge)",
    ),
    Case(
        "regmean",
        FLOAT32,
        "W̄ + (ΣG̃)⁺ Σ G̃_k (W_k − W̄)ᵀ: with equal W_k the correction is (ΣG̃)⁺ applied to "
        "float64 rounding of W̄, negligible even where ΣG̃ is ill-conditioned; exact for one",
    ),
    Case(
        "regmean:alpha=1",
        FLOAT32,
        "α = 1: the Grams themselves, singular wherever the data span fewer directions than "
        "the layer's inputs (dead units, and inputs that are always equal, such as constant "
        "pixels), more often than α = 0.9's; the same bound",
    ),
    Case(
        "fedlpa",
        FLOAT32,
        "the expectation approximation Ḡ⁻¹ Z Ā⁻¹ is exact for equal clients but for float64 "
        "pseudo-inverses of the damped factors (error ~ε₆₄·κ(Ā)·κ(Ḡ), each κ at most the "
        "largest eigenvalue over γ ≈ 0.032), then one rounding to float32; conjugate "
        "gradients stop at once (the residual is below cg_tol = 1e-8 of ‖Z‖), so no CG step "
        "brings in its error bound cg_tol·κ(T), which could be far above an ulp",
    ),
    Case(
        "fedlpa:solver=approx",
        FLOAT32,
        "the expectation approximation alone: the same pseudo-inverse bound as cg's start",
    ),
    Case(
        "fedlpa:solver=gd:gd_steps=20",
        FLOAT32,
        "the authors' gradient descent from the approximation on a residual that is float64 "
        "rounding; a step that raised the residual would return the approximation",
    ),
    Case(
        "fedlpa:scaling=kfac_pytorch",
        FLOAT32,
        "the authors' convolution scaling (A/S², G·S²): the same A ⊗ G split differently; "
        "the same pseudo-inverse bound",
    ),
    Case(
        "ma_echo",
        FLOAT32,
        "equal clients are a fixed point of both steps: the consensus pull Σ(W − W_m)(I − P_m) "
        "and each echo step λ(W − W_m)P_m vanish where W = W_m; the consensus starts at the "
        "class-split average of equal models, itself",
    ),
    Case(
        "ma_echo:normalise=true:step=0.05",
        FLOAT32,
        "the code's CIFAR preset (at 60 iterations, not 300): the echo step is row-normalised, "
        "λ(W − W_m)P_m/‖·‖, so a rounding-size difference W − W_m would become a step of "
        "length λ = 0.05 each iteration; the fixed point holds only if the start is exactly "
        "the clients' model (the class-split average is taken in float64 for this)",
    ),
    Case(
        "ma_echo:bias=average",
        FLOAT32,
        "biases averaged plainly, outside the projection: the same fixed point",
    ),
)


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Federation]:
    """The tiny digits federation (3 clients, one epoch) of an architecture, prepared once;
    trained models are cached, so every method's client step reuses one training."""
    made: dict[str, Federation] = {}
    cache = tmp_path_factory.mktemp("merge-properties")

    def get(arch: str) -> Federation:
        if arch not in made:
            values: dict[str, Any] = {**TINY, "model": arch, "cache_dir": str(cache / arch)}
            made[arch] = prepare(make_config({**values, "methods": ["fedavg"]}))
        return made[arch]

    return get


Payloads = Callable[[str, str, int], tuple[Method[Any], Payload]]


@pytest.fixture(scope="module")
def client_payload(federation: Callable[[str], Federation]) -> Payloads:
    """(arch, spec, client) → the method and what that client sends it, through the wire:
    encoded, decoded and validated as the server receives it (memoised)."""
    made: dict[tuple[str, str, int], tuple[Method[Any], Payload]] = {}

    def get(arch: str, spec: str, client: int) -> tuple[Method[Any], Payload]:
        key = (arch, spec, client)
        if key not in made:
            fed, method = federation(arch), build_method(spec)
            payload = decode(encode(method.client_update(fed.client_context(client))))
            validate_payload(payload, method.payload_spec(fed.dims), fed.dims, client)
            made[key] = method, payload
        return made[key]

    return get


def merge(method: Method[Any], fed: Federation, payloads: Mapping[int, Payload]) -> nn.Module:
    """The server's aggregate of ``payloads``, as a run calls it (round 0), as one model."""
    ctx = fed.server_view().server_context(method.requires).for_round(0, None)
    outcome = method.aggregate(payloads, ctx)
    assert isinstance(outcome, GlobalModel)
    return outcome.model


def errors(model: nn.Module, payload: Payload) -> dict[str, float]:
    """Per tensor of ``model``'s state, |model − payload's model|∞ / max(|payload's|∞, 1)
    (integer buffers: 0 if equal, inf if not)."""
    sent = {k[len("model.") :]: v for k, v in payload.arrays.items() if k.startswith("model.")}
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    assert set(state) == set(sent)
    out = {}
    for key, own in sent.items():
        got = state[key]
        assert got.shape == own.shape and got.dtype == own.dtype, key
        if not np.issubdtype(own.dtype, np.floating):
            out[key] = 0.0 if np.array_equal(got, own) else float("inf")
            continue
        if not np.isfinite(got).all():
            out[key] = float("inf")
            continue
        scale = max(float(np.abs(own).max(initial=0.0)), 1.0)
        diff = np.abs(got.astype(np.float64) - own.astype(np.float64)).max(initial=0.0)
        out[key] = float(diff) / scale
    return out


def with_size(payload: Payload, n: int) -> Payload:
    """``payload`` reporting ``n`` examples."""
    return Payload(payload.arrays, {**payload.scalars, "n_examples": n})


FEDERATIONS: dict[str, Callable[[Payload], dict[int, Payload]]] = {
    "one-client": lambda p: {0: p},
    "three-identical": lambda p: {0: p, 1: p, 2: p},
    "three-identical-unequal-sizes": lambda p: {
        0: p,
        3: with_size(p, max(1, int(p.scalars["n_examples"]) // 3)),
        7: with_size(p, max(1, int(p.scalars["n_examples"]) // 7)),
    },
}
"""How the copies of one client's payload make a federation (ids need not be 0..n-1)."""


@pytest.mark.parametrize("who", list(FEDERATIONS))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_identical_clients_merge_to_their_model(
    case: Case, arch: str, who: str, federation: Any, client_payload: Payloads
) -> None:
    """One client, or three that send the same model and statistics, get that model back
    (within the case's tolerance; see :data:`CASES`)."""
    method, payload = client_payload(arch, case.spec, 0)
    merged = merge(method, federation(arch), FEDERATIONS[who](payload))
    err = errors(merged, payload)
    worst = max(err, key=err.__getitem__)
    assert err[worst] <= case.rtol, (
        f"{case.spec} on {arch} ({who}): tensor {worst} is {err[worst]:.3g} (relative) away "
        f"from the client's model, tolerance {case.rtol:g} ({case.why})"
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_two_different_clients_do_not_merge_to_either_one(
    case: Case, arch: str, federation: Any, client_payload: Payloads
) -> None:
    """The property's check can fail: two clients with different data merge to a model that
    is, in some tensor, more than 100 tolerances away from each of theirs."""
    method, first = client_payload(arch, case.spec, 0)
    _, second = client_payload(arch, case.spec, 1)
    merged = merge(method, federation(arch), {0: first, 1: second})
    for own in (first, second):  # the weights, not BatchNorm's counters of batches seen
        err = errors(merged, own)
        weights = [
            v for k, v in err.items() if np.issubdtype(own.arrays[f"model.{k}"].dtype, np.floating)
        ]
        assert max(weights) > 100 * case.rtol, case.spec


@pytest.mark.parametrize("alpha", [1.0, 0.9])
def test_regmean_keeps_the_average_where_no_client_activates_an_input(alpha: float) -> None:
    """An input that no client's data reach (a dead ReLU unit, a pixel that is always 0)
    gives every Gram a zero row and column, so RegMean's least-squares objective does not
    constrain that column of W. The pseudo-inverse alone (the authors' code) sets it to 0, so
    that one client did not merge to itself, nor identical clients to their model; the merge
    now keeps the clients' p-weighted average there (as FedFisher and the K-FAC merges keep
    FedAvg where the curvature is blind) and is unchanged on the inputs the data span."""
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(30, 4)) for _ in range(2)]
    for x in xs:
        x[:, 2] = 0.0  # input 2: never active
    grams = [x.T @ x / len(x) for x in xs]
    ws = [rng.normal(size=(3, 4)) for _ in range(2)]
    assert np.allclose(regmean_weight(grams[:1], ws[:1], [1.0], alpha), ws[0], atol=1e-12)
    assert np.allclose(regmean_weight(grams, [ws[0]] * 2, [0.3, 0.7], alpha), ws[0], atol=1e-12)
    merged = regmean_weight(grams, ws, [0.25, 0.75], alpha)
    assert np.allclose(merged[:, 2], 0.25 * ws[0][:, 2] + 0.75 * ws[1][:, 2], atol=1e-12)
    seen = [0, 1, 3]  # on the rest: the merge of the clients without input 2
    alone = regmean_weight(
        [g[np.ix_(seen, seen)] for g in grams], [w[:, seen] for w in ws], [0.25, 0.75], alpha
    )
    assert np.allclose(merged[:, seen], alone, atol=1e-10)


def test_ma_echo_averages_equal_clients_to_exactly_their_weights() -> None:
    """MA-Echo's start, the class-split average, of clients with equal tensors is exactly
    those tensors, so the normalised echo step (the code's CIFAR preset) has nothing to
    scale up. Averaged in float32, (w + w + w) / 3 missed w by an ulp in some entries, and
    ``normalise`` turned each such row's rounding into a step of length λ every iteration."""
    gen = torch.Generator().manual_seed(0)
    body, head = torch.randn(64, 33, generator=gen), torch.randn(10, 64, generator=gen)
    states = [{"body.weight": body.clone(), "head.weight": head.clone()} for _ in range(3)]
    holds = torch.ones(3, 10, dtype=torch.bool)
    holds[1, :4] = False  # rows averaged over two or three clients
    out = _class_split_average(states, holds)
    assert torch.equal(out["body.weight"], body) and torch.equal(out["head.weight"], head)
    projections = [torch.eye(33) * 0.5] * 3
    consensus, moved = ma_echo_consensus_step(
        out["body.weight"],
        [s["body.weight"] for s in states],
        projections,
        torch.eye(33),
        0.05,
        True,
    )
    assert torch.equal(consensus, body) and all(torch.equal(m, body) for m in moved)
