"""Client statistics against the libraries they are defined by (issue 51), on a tiny MLP and
the registered ``cnn``: FedFisher's diagonal and K-FAC Fisher against nngeometry, the library
its authors compute both with (``Divyansh03/FedFisher``, ``train_model.py``: ``FIM(net, loader,
representation=PMatDiag | PMatKFAC, n_output=C)``, default ``variant='classif_logits'``;
``requirements.txt`` pins nngeometry 0.3), and the K-FAC factors A and G of every linear and
convolutional layer against curvlinops' ``KFACLinearOperator``. Test-only extra ``crosscheck``
(``pip install -e '.[crosscheck]'``); each test is skipped, with its reason, without it.

Conventions, ours (:func:`~oneshotfl.methods.fedfisher.diagonal_fisher`,
:func:`~oneshotfl.methods.kfac.kfac_factors`) made equal to the library's:

* Fisher. ``true``: Σ_c p_c(x) ∇log p_c ∇log p_cᵀ, the expectation over the model's own
  predictions taken exactly (no sampled labels). nngeometry ``variant='classif_logits'``
  differentiates m outputs whose outer products sum to it (0.3: √p_c·log p_c, p detached,
  m = C; 0.4: a square root of diag(p) − ppᵀ with m = C − 1); curvlinops
  ``FisherType.TYPE2`` backpropagates the exact square root of the cross-entropy's Hessian
  in the logits, diag(p) − ppᵀ. ``empirical``: ∇log p_y ∇log p_yᵀ at the true label y;
  nngeometry ``variant='regression'`` on the one output log p_y(x) (JᵀJ), curvlinops
  ``FisherType.EMPIRICAL``. The sign of the loss (−log p) cancels in every outer product.
* Reduction. Outer products per example, summed and divided by n, the number of examples.
  The libraries see batches of 7 of 24 examples (the last one short) and ours one batch, so
  a per-batch normalisation or a batch-summed gradient shows. curvlinops: the ``mean``
  cross-entropy with ``num_data=n`` (its correction B²/n turns the batch mean back into
  the per-example sum over n).
* Bias. Ours appends an input 1 to A's rows (W̄ = [W | b]), as nngeometry does and
  curvlinops with ``separate_weight_and_bias=False``.
* Convolutions. ``F.unfold`` patches (channel, kh, kw order) at each of the S output
  locations. Ours (``scaling=kfc``: Grosse and Martens' KFC, nngeometry's S-split):
  A = (1/n) Σ_x Σ_s a aᵀ, G = (1/n) Σ_x (1/S) Σ_s g gᵀ. curvlinops' KFAC-expand averages A
  over the locations and sums G: A/S, S·G. FedLPA's ``scaling=kfac_pytorch``: A/S², S²·G.
* nngeometry's split: its A is ours times √m, its G ours over √m (m as above; m = 1 for
  the empirical Fisher), the same A ⊗ G. FedFisher's server only applies the product,
  ``F.mv(w)`` = G W̄ A per layer, which is checked against our
  :func:`~oneshotfl.methods.kfac.kfac_operator` too.
* Mode. Eval mode (our clients). The authors' clients call ``FIM`` on a network left in
  train mode; for these models (no dropout, no BatchNorm) the two are the same.
* The diagonal: nngeometry's flat vector runs layer by layer, weight then bias, the order of
  ``parameters_to_vector`` with which the authors' server aligns it with the model.

The libraries run on the very model ours does (its in-place ReLUs included: torch hands a
tensor hook registered before an in-place change the gradient of the value it was
registered on). Both agree with ours to about 3e-7 of the largest entry (float32).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from oneshotfl.data.types import LabelledData
from oneshotfl.methods.fedfisher import diagonal_fisher
from oneshotfl.methods.kfac import (
    FisherKind,
    KfacScaling,
    augmented_weight,
    kfac_factors,
    kfac_operator,
    split_augmented,
)
from oneshotfl.models import create_model
from oneshotfl.protocol.layer_stats import kfac_layers

CPU = torch.device("cpu")
CLASSES = 5
EXAMPLES = 24
LIBRARY_BATCH = 7
"""The libraries' batch size: 24 examples in batches of 7, 7, 7 and 3."""
RTOL = 1e-5
"""Largest |ours − theirs| as a fraction of max |theirs|: float32 sums in another order
reach about 3e-7. A convention slip is off by 1% or more
(:func:`test_a_kfac_convention_slip_fails_the_check`)."""
SLIP = 100 * RTOL
"""What a slip must be off by, at least (a tenth of the 1% slip): the check sees it with a
wide margin."""
ARCHS = ("mlp", "cnn")
KINDS: tuple[FisherKind, ...] = ("true", "empirical")
EXTRA = "test-only extra: pip install -e '.[crosscheck]'"
NNGEOMETRY_MISSING = f"nngeometry is not installed ({EXTRA})"
CURVLINOPS_MISSING = f"curvlinops-for-pytorch is not installed ({EXTRA})"

Factors = dict[str, torch.Tensor]


def _setting(arch: str) -> tuple[nn.Module, LabelledData]:
    """A tiny model at its seeded initialisation and 24 labelled examples: ``mlp`` on 1×4×4
    inputs (16 → 200 → 200 → 5); ``cnn`` on 3×8×8 inputs (conv 3 → 6 at S = 64 locations,
    conv 6 → 16 at S = 16, FC 64 → 120 → 84 → 5)."""
    torch.manual_seed(0)
    channels, side = (1, 4) if arch == "mlp" else (3, 8)
    model = create_model(arch, channels, CLASSES, side).eval()
    x = torch.randn(EXAMPLES, channels, side, side)
    return model, LabelledData(x, torch.randint(0, CLASSES, (EXAMPLES,)))


def _locations(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """S, the output locations of every K-FAC layer (1 for a linear layer)."""
    found: dict[str, int] = {}

    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def record(_: nn.Module, __: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            found[name] = out.shape[2] * out.shape[3] if out.dim() == 4 else 1

        return record

    handles = [m.register_forward_hook(hook(k)) for k, m in kfac_layers(model).items()]
    with torch.no_grad():
        model(x[:1])
    for h in handles:
        h.remove()
    return found


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours − theirs| / max |theirs| (inf for different shapes)."""
    theirs = theirs.detach().double()
    if tuple(ours.shape) != tuple(theirs.shape):
        return math.inf
    scale = max(float(theirs.abs().max()), 1e-30)
    return float((ours.double() - theirs).abs().max()) / scale


def _assert_close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    error = _relative_error(ours, theirs)
    assert error <= RTOL, f"{what}: ours is off the library's by {error:.2e} of its largest entry"


# nngeometry (FedFisher's authors' library)


def _nngeometry_outputs(kind: FisherKind) -> int:
    """m, the outputs nngeometry differentiates per example (its K-FAC scales A by √m and G
    by 1/√m): 1 for the empirical Fisher; for ``classif_logits`` C in 0.3.x, C − 1 from 0.4."""
    if kind == "empirical":
        return 1
    release = tuple(int(part) for part in version("nngeometry").split(".")[:2])
    return CLASSES - 1 if release >= (0, 4) else CLASSES


def _nngeometry_fim(model: nn.Module, data: LabelledData, kind: FisherKind, matrix: str) -> Any:
    """nngeometry's ``FIM`` of ``model`` in representation ``matrix`` (``PMatDiag``,
    ``PMatKFAC``), called as FedFisher's clients call it for ``true``."""
    metrics = pytest.importorskip("nngeometry.metrics", reason=NNGEOMETRY_MISSING)
    representation = getattr(importlib.import_module("nngeometry.object"), matrix)
    loader = DataLoader(TensorDataset(data.x, data.y), batch_size=LIBRARY_BATCH)
    kwargs: dict[str, Any] = {"variant": "classif_logits"}
    if kind == "empirical":

        def log_p_label(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(model(x), 1).gather(1, y.view(-1, 1))

        kwargs = {"variant": "regression", "function": log_p_label}
    if "n_output" in inspect.signature(metrics.FIM).parameters:  # 0.3.x: the authors' call
        kwargs["n_output"] = CLASSES if kind == "true" else 1
    return metrics.FIM(model=model, loader=loader, representation=representation, **kwargs)


def _flat(vector: Any) -> torch.Tensor:
    """A ``PVector`` as one flat tensor (``to_torch`` from 0.4, before it
    ``get_flat_representation``)."""
    flat = vector.to_torch() if hasattr(vector, "to_torch") else vector.get_flat_representation()
    assert isinstance(flat, torch.Tensor)
    return flat


def _diagonal_error(model: nn.Module, ours: Factors, theirs: torch.Tensor) -> dict[str, float]:
    """The relative error of every parameter's diagonal against its slice of nngeometry's
    flat diagonal (``parameters_to_vector``'s order)."""
    errors, start = {}, 0
    for name, p in model.named_parameters():
        errors[name] = _relative_error(ours[name], theirs[start : start + p.numel()].view_as(p))
        start += p.numel()
    assert start == theirs.numel(), "nngeometry's diagonal covers other parameters"
    return errors


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_diagonal_fisher_is_nngeometrys(arch: str, kind: FisherKind) -> None:
    model, data = _setting(arch)
    theirs = _nngeometry_fim(model, data, kind, "PMatDiag").get_diag()
    ours = diagonal_fisher(model, data, CPU, kind)
    for name, error in _diagonal_error(model, ours, theirs).items():
        assert error <= RTOL, f"{arch} {kind} Fisher of {name}: off by {error:.2e}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_kfac_factors_are_nngeometrys(arch: str, kind: FisherKind) -> None:
    model, data = _setting(arch)
    ours = kfac_factors(model, data, CPU, kind)
    fim = _nngeometry_fim(model, data, kind, "PMatKFAC")
    layers = kfac_layers(model)
    blocks = list(fim.data.values())  # nngeometry's layers, in module order as ours
    assert len(blocks) == len(layers)
    root = math.sqrt(_nngeometry_outputs(kind))
    for name, (a, g) in zip(layers, blocks, strict=True):
        _assert_close(ours[f"{name}.A"] * root, a, f"{arch} {kind} {name}.A·√m")
        _assert_close(ours[f"{name}.G"] / root, g, f"{arch} {kind} {name}.G/√m")
    # FedFisher's server applies the clients' factors as F.mv(w) (algs/fisher_avg.py); ours
    # as T(W̄) = G W̄ A: the same vector, layer by layer, weight then bias
    vector = importlib.import_module("nngeometry.object").PVector.from_model(model)
    theirs = _flat(fim.mv(vector))
    state, parts = model.state_dict(), []
    one = torch.ones(1, dtype=torch.float64)
    for name, layer in layers.items():
        keys = ["weight"] + (["bias"] if layer.bias is not None else [])
        w = augmented_weight({k: state[f"{name}.{k}"] for k in keys}).double()
        a, g = ours[f"{name}.A"].double()[None], ours[f"{name}.G"].double()[None]
        product = split_augmented(kfac_operator(w, a, g, one), layer.weight.shape, len(keys) > 1)
        parts += [product[k].flatten() for k in keys]
    _assert_close(torch.cat(parts), theirs, f"{arch} {kind} F·w")


def _per_batch_empirical_diagonal(model: nn.Module, data: LabelledData) -> Factors:
    """A slip: the square of each batch's summed gradient instead of each example's."""
    total = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    for start in range(0, len(data), LIBRARY_BATCH):
        x, y = data.x[start : start + LIBRARY_BATCH], data.y[start : start + LIBRARY_BATCH]
        log_p = torch.log_softmax(model(x), 1).gather(1, y.view(-1, 1)).sum()
        grads = torch.autograd.grad(log_p, list(model.parameters()))
        for (k, _), g in zip(model.named_parameters(), grads, strict=True):
            total[k] += g.square()
    return {k: v / len(data) for k, v in total.items()}


def test_a_diagonal_convention_slip_fails_the_check() -> None:
    """Each slip misses nngeometry's diagonal by far more than the tolerance: the check is
    tight enough to see the conventions it claims to match."""
    model, data = _setting("cnn")
    theirs = {kind: _nngeometry_fim(model, data, kind, "PMatDiag").get_diag() for kind in KINDS}
    empirical = diagonal_fisher(model, data, CPU, "empirical")
    assert max(_diagonal_error(model, empirical, theirs["empirical"]).values()) <= RTOL
    slips = {
        "1% off": (theirs["empirical"], {k: v * 1.01 for k, v in empirical.items()}),
        "the empirical Fisher for the true one": (theirs["true"], empirical),
        "the true Fisher for the empirical one": (
            theirs["empirical"],
            diagonal_fisher(model, data, CPU, "true"),
        ),
        "batch gradients squared": (
            theirs["empirical"],
            _per_batch_empirical_diagonal(model, data),
        ),
    }
    for slip, (reference, ours) in slips.items():
        error = max(_diagonal_error(model, ours, reference).values())
        assert error > SLIP, f"{slip}: off by only {error:.2e}, the check cannot see it"


# curvlinops (K-FAC factors)


def _curvlinops_factors(model: nn.Module, data: LabelledData, kind: FisherKind) -> Factors:
    """curvlinops' KFAC-expand factors, ``<layer>.A`` and ``<layer>.G`` (see the module
    docs for its arguments)."""
    curvlinops = pytest.importorskip("curvlinops", reason=CURVLINOPS_MISSING)
    batches = [
        (data.x[start : start + LIBRARY_BATCH], data.y[start : start + LIBRARY_BATCH])
        for start in range(0, len(data), LIBRARY_BATCH)
    ]
    fisher = curvlinops.FisherType.TYPE2 if kind == "true" else curvlinops.FisherType.EMPIRICAL
    kfac = curvlinops.KFACLinearOperator(
        model,
        nn.CrossEntropyLoss(reduction="mean"),
        list(model.parameters()),
        batches,
        check_deterministic=False,
        fisher_type=fisher,
        kfac_approx=curvlinops.KFACType.EXPAND,
        num_per_example_loss_terms=1,
        separate_weight_and_bias=False,
        num_data=len(data),
    )
    kfac.compute_kronecker_factors()
    state = kfac.state_dict()
    factors = {f"{k}.A": v for k, v in state["input_covariances"].items()}
    return factors | {f"{k}.G": v for k, v in state["gradient_covariances"].items()}


def _kfac_errors(
    ours: Factors, theirs: Factors, locations: dict[str, int], scaling: KfacScaling
) -> dict[str, float]:
    """The relative error of every factor against curvlinops', ours moved to its split:
    A·f and G/f with f = 1/S (``kfc``) or S (``kfac_pytorch``)."""
    assert sorted(ours) == sorted(theirs)
    errors = {}
    for name, s in locations.items():
        f = 1 / s if scaling == "kfc" else s
        errors[f"{name}.A"] = _relative_error(ours[f"{name}.A"] * f, theirs[f"{name}.A"])
        errors[f"{name}.G"] = _relative_error(ours[f"{name}.G"] / f, theirs[f"{name}.G"])
    return errors


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("arch", "scaling"), [("mlp", "kfc"), ("cnn", "kfc"), ("cnn", "kfac_pytorch")]
)
def test_the_kfac_factors_are_curvlinops(arch: str, scaling: KfacScaling, kind: FisherKind) -> None:
    model, data = _setting(arch)
    theirs = _curvlinops_factors(model, data, kind)
    ours = kfac_factors(model, data, CPU, kind, scaling)
    locations = _locations(model, data.x)
    assert sorted(s for s in locations.values() if s > 1) == ([] if arch == "mlp" else [16, 64])
    for factor, error in _kfac_errors(ours, theirs, locations, scaling).items():
        assert error <= RTOL, f"{arch} {kind} {scaling} {factor}: off by {error:.2e}"


def test_a_kfac_convention_slip_fails_the_check() -> None:
    """Each slip misses curvlinops' factors by far more than the tolerance (on the ``cnn``,
    where a convolution's locations can be mis-split)."""
    model, data = _setting("cnn")
    theirs = {kind: _curvlinops_factors(model, data, kind) for kind in KINDS}
    locations = _locations(model, data.x)
    ours = kfac_factors(model, data, CPU, "true")
    assert max(_kfac_errors(ours, theirs["true"], locations, "kfc").values()) <= RTOL
    conv = [k for k, s in locations.items() if s > 1]

    def changed(edit: Callable[[str, torch.Tensor], torch.Tensor]) -> Factors:
        return {k: edit(k, v.clone()) for k, v in ours.items()}

    def no_bias_input(key: str, v: torch.Tensor) -> torch.Tensor:
        if key.endswith(".A"):
            v[-1, :], v[:, -1] = 0, 0
        return v

    slips: dict[str, tuple[Factors, Factors]] = {
        "1% off": (theirs["true"], changed(lambda k, v: v * 1.01 if k.endswith(".G") else v)),
        "G summed over a convolution's locations": (
            theirs["true"],
            changed(lambda k, v: v * locations[k[:-2]] if k[:-2] in conv and k[-1] == "G" else v),
        ),
        "divided by batches, not examples": (
            theirs["true"],
            changed(lambda k, v: v * EXAMPLES / math.ceil(EXAMPLES / LIBRARY_BATCH)),
        ),
        "no input 1 for the bias": (theirs["true"], changed(no_bias_input)),
        "the empirical Fisher for the true one": (
            theirs["true"],
            kfac_factors(model, data, CPU, "empirical"),
        ),
        "the true Fisher for the empirical one": (theirs["empirical"], ours),
        "kfac_pytorch's split taken for kfc's": (
            theirs["true"],
            kfac_factors(model, data, CPU, "true", "kfac_pytorch"),
        ),
    }
    for slip, (reference, factors) in slips.items():
        error = max(_kfac_errors(factors, reference, locations, "kfc").values())
        assert error > SLIP, f"{slip}: off by only {error:.2e}, the check cannot see it"
