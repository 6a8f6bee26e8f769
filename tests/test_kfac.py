"""K-FAC factors and the layer-wise posterior merge (FedLPA, FedFisher's K-FAC variant)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad

from oneshotfl.data.types import LabelledData
from oneshotfl.methods.kfac import (
    augmented_weight,
    damped,
    expectation_approximation,
    fedlpa_gradient_descent,
    kfac_conjugate_gradient,
    kfac_factors,
    kfac_largest_eigenvalue,
    kfac_operator,
    kfac_target,
    split_augmented,
)

CPU = torch.device("cpu")


def _one_example_fisher(model: nn.Module, x: torch.Tensor, y: int) -> dict[str, torch.Tensor]:
    """The exact empirical Fisher of each layer's [W | b] on one example (its gradient's outer
    product), rows in W̄'s row-major order."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def log_p(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.log_softmax(functional_call(model, p, (x.unsqueeze(0),)), -1)[0, y]

    grads = grad(log_p)(params)
    out = {}
    for layer in ("0", "3"):
        g = augmented_weight({"weight": grads[f"{layer}.weight"], "bias": grads[f"{layer}.bias"]})
        out[layer] = torch.outer(g.flatten(), g.flatten())
    return out


def test_on_one_example_the_factors_are_the_exact_fisher_of_each_layer() -> None:
    """For one example and a convolution with one output location, A ⊗ G is exactly the
    layer's gradient outer product (K-FAC's only approximation is over examples and places)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 4), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(3, 4))
    x = torch.randn(1, 2, 4, 4)
    factors = kfac_factors(model, LabelledData(x, torch.tensor([2])), CPU, "empirical")
    exact = _one_example_fisher(
        nn.Sequential(model[0], nn.ReLU(), nn.Flatten(), model[3]).eval(), x[0], 2
    )
    for layer in ("0", "3"):
        a, g = factors[f"{layer}.A"].double(), factors[f"{layer}.G"].double()
        # row-major vec(W̄): the Fisher of vec(W̄) is G ⊗ A
        assert torch.allclose(torch.kron(g, a), exact[layer].double(), atol=1e-6), layer
    assert factors["0.A"].shape == (2 * 4 * 4 + 1,) * 2 and factors["3.G"].shape == (4, 4)


def test_the_true_fishers_g_is_the_expectation_over_the_models_predictions() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4))
    x = torch.randn(5, 3)
    got = kfac_factors(model, LabelledData(x, torch.zeros(5, dtype=torch.long)), CPU, "true")
    probs = torch.softmax(model(x), -1).detach()
    # ∂ log p_c / ∂ logits = e_c − p, so G = mean_x Σ_c p_c (e_c − p)(e_c − p)ᵀ = diag(p) − p pᵀ
    want = (torch.diag_embed(probs) - probs.unsqueeze(2) * probs.unsqueeze(1)).mean(0)
    assert torch.allclose(got["0.G"], want, atol=1e-6)
    rows = torch.cat([x, torch.ones(5, 1)], 1)
    assert torch.allclose(got["0.A"], rows.T @ rows / 5, atol=1e-6)


def _problem(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)

    def spd(n: int) -> torch.Tensor:
        x = torch.randn(n, 2 * n, generator=gen, dtype=torch.float64)
        return x @ x.T / n

    a = torch.stack([spd(7) for _ in range(3)])
    g = torch.stack([spd(4) for _ in range(3)])
    w = torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)
    return a, g, w, torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)


def test_conjugate_gradients_find_the_product_of_the_posteriors_mean() -> None:
    a, g, w, p = _problem()
    z = kfac_target(w, a, g, p)
    precision = sum(p[k] * torch.kron(g[k], a[k]) for k in range(3))  # row-major vec
    assert isinstance(precision, torch.Tensor)
    exact = torch.linalg.solve(precision, z.flatten()).reshape(4, 7)
    start = expectation_approximation(z, a, g, p)
    solved, iterations = kfac_conjugate_gradient(start, z, a, g, p, 500, 1e-12)
    assert torch.allclose(solved, exact, atol=1e-8) and iterations < 500
    assert not torch.allclose(start, exact, atol=1e-3)  # the approximation is only that
    assert torch.allclose(kfac_operator(exact, a, g, p), z, atol=1e-9)
    # identical clients: the posterior mean is their model, for every solver
    same = w[:1].expand(3, -1, -1)
    z_same = kfac_target(same, a, g, p)
    assert torch.allclose(kfac_conjugate_gradient(start, z_same, a, g, p, 500, 1e-12)[0], w[0])
    one = (a[:1].expand(3, -1, -1), g[:1].expand(3, -1, -1))
    z_one = kfac_target(same, *one, p)
    assert torch.allclose(expectation_approximation(z_one, *one, p), w[0], atol=1e-8)


def test_the_authors_gradient_descent_never_returns_nan() -> None:
    a, g, w, p = _problem(1)
    z = kfac_target(w, a, g, p)
    start = expectation_approximation(z, a, g, p)
    blown, diverged = fedlpa_gradient_descent(start, z, a, g, p, 2000, 1.0)
    assert diverged and torch.equal(blown, start)  # lr too large: the approximation is kept
    small, diverged = fedlpa_gradient_descent(start, z, a, g, p, 2000, 1e-3)
    assert not diverged and torch.isfinite(small).all()
    before = (kfac_operator(start, a, g, p) - z).norm()
    assert (kfac_operator(small, a, g, p) - z).norm() < before


def test_singular_factors_are_damped_and_never_give_nan() -> None:
    a, g, w, p = _problem(2)
    a, g = torch.zeros_like(a), torch.zeros_like(g)  # a layer no client's data reached
    a, g = damped(a, 0.1), damped(g, 0.1)
    z = kfac_target(w, a, g, p)
    start = expectation_approximation(z, a, g, p)
    solved, _ = kfac_conjugate_gradient(start, z, a, g, p, 50, 1e-10)
    assert torch.allclose(solved, (p.view(-1, 1, 1) * w).sum(0))  # the prior alone: the average
    undamped_z = torch.zeros(4, 7, dtype=torch.float64)
    m = expectation_approximation(undamped_z, torch.zeros_like(a), torch.zeros_like(g), p)
    assert torch.isfinite(m).all()


@pytest.mark.parametrize("bias", [True, False])
def test_augmented_weights_round_trip(bias: bool) -> None:
    conv = nn.Conv2d(2, 3, 3, bias=bias)
    state: dict[str, Any] = dict(conv.state_dict())
    m = augmented_weight(state)
    assert m.shape == (3, 2 * 9 + bias)
    back = split_augmented(m, conv.weight.shape, bias)
    for k, v in state.items():
        assert torch.equal(back[k], v)


def test_the_authors_scaling_splits_a_convolutions_factors_as_kfac_pytorch_does() -> None:
    """``scaling=kfac_pytorch`` is the KFAC-Pytorch code FedLPA's authors use, written out here
    from its definitions: A from the patches divided by S (averaged over the batch), G from the
    batch-mean loss's output gradients times B·S (averaged over the B·S rows). A ⊗ G is the
    same as ``kfc``'s; linear layers are untouched."""
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 5, 4)
    )
    x, y = torch.randn(6, 2, 5, 5), torch.tensor([0, 1, 2, 3, 0, 1])
    data = LabelledData(x, y)
    theirs = kfac_factors(model, data, CPU, "empirical", "kfac_pytorch")
    ours = kfac_factors(model, data, CPU, "empirical")
    batch, s = 6, 25
    patches = torch.nn.functional.unfold(x, 3, padding=1).transpose(1, 2).reshape(-1, 18)
    a = torch.cat([patches, torch.ones(len(patches), 1)], 1) / s
    out = model[0](x)
    out.retain_grad()
    nn.functional.cross_entropy(model[3](model[2](model[1](out))), y).backward()
    assert out.grad is not None
    g = out.grad.permute(0, 2, 3, 1).reshape(-1, 3) * batch * s
    assert torch.allclose(theirs["0.A"], a.T @ a / batch, rtol=1e-4, atol=1e-7)
    assert torch.allclose(theirs["0.G"], g.T @ g / (batch * s), rtol=1e-4, atol=1e-7)
    kron = torch.kron(theirs["0.G"].double(), theirs["0.A"].double())
    assert torch.allclose(kron, torch.kron(ours["0.G"].double(), ours["0.A"].double()), atol=1e-9)
    assert not torch.allclose(theirs["0.A"], ours["0.A"])
    for key in ("3.A", "3.G"):
        assert torch.equal(theirs[key], ours[key])


def test_the_largest_eigenvalue_is_the_kronecker_products_and_marks_where_gd_diverges() -> None:
    a, g, w, p = _problem(4)
    precision = sum(p[k] * torch.kron(g[k], a[k]) for k in range(3))
    assert isinstance(precision, torch.Tensor)
    exact = float(torch.linalg.eigvalsh(precision).max())
    got = kfac_largest_eigenvalue(a, g, p, steps=2000)
    assert got == pytest.approx(exact, rel=1e-6)
    z = kfac_target(w, a, g, p)
    start = expectation_approximation(z, a, g, p)
    edge = 1.0 / (got * got * 2.0 / w[0].numel())  # η·(2/N)·λ² = 2 at η = 2·edge
    assert fedlpa_gradient_descent(start, z, a, g, p, 3000, 2.2 * edge)[1]  # past it: diverges
    assert not fedlpa_gradient_descent(start, z, a, g, p, 3000, 1.8 * edge)[1]
