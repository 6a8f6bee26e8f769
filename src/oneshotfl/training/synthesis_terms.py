"""Terms and tools that data-free methods share on the server: the BatchNorm-statistics
regulariser of DeepInversion / DENSE (:class:`BatchNormStatistics`), the DCGAN
re-initialisation the authors' synthesisers apply to their generator every round
(:func:`reinitialise`), and the output-diversified sampling (ODS) perturbation Co-Boosting and
IntactOFL's code apply to every learner batch (:func:`ods_perturbation`).

Every random draw comes from a caller's ``torch.Generator`` (drawn on its device, then moved),
so runs stay bit-identical for a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

_Hook = Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]


class BatchNormStatistics:
    """Context manager recording BatchNorm input statistics of frozen teachers.

    Inside the ``with`` block every forward pass through a teacher records, per BatchNorm layer,
    the batch mean and biased variance of the layer's input (over all dims but the channel dim).
    A layer's record is overwritten by its next forward pass; call :meth:`clear` between passes
    to forget them. Teachers are put in eval mode on enter (running statistics never change) and
    their previous modes are restored on exit, when the hooks are removed.

    Teachers without BatchNorm layers (an MLP, a LeNet without BN) have ``layers == 0``; the term
    is then a constant zero, so the BN regulariser simply drops out of such methods' losses.
    Layers built with ``track_running_stats=False`` have no reference statistics and are skipped.
    """

    def __init__(self, teachers: Sequence[nn.Module]) -> None:
        self._teachers = list(teachers)
        self._bns: list[nn.modules.batchnorm._BatchNorm] = []
        self._first: set[int] = set()  # each teacher's first layer (DeepInversion weighs it up)
        for t in self._teachers:
            layers = [
                m
                for m in t.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
            ]
            self._first |= {len(self._bns)} if layers else set()
            self._bns += layers
        self._terms: dict[int, torch.Tensor] = {}
        self._handles: list[RemovableHandle] = []
        self._modes: list[bool] = []

    @property
    def layers(self) -> int:
        """Number of BatchNorm layers hooked across all teachers."""
        return len(self._bns)

    def __enter__(self) -> BatchNormStatistics:
        self._modes = [t.training for t in self._teachers]
        for t in self._teachers:
            t.eval()
        self._handles = [
            bn.register_forward_hook(self._make_hook(i)) for i, bn in enumerate(self._bns)
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for t, mode in zip(self._teachers, self._modes, strict=True):
            t.train(mode)
        self.clear()

    def _make_hook(self, index: int) -> _Hook:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            assert isinstance(module, nn.modules.batchnorm._BatchNorm)
            x = args[0]
            dims = [0, *range(2, x.dim())]
            mean = x.mean(dim=dims)
            var = x.var(dim=dims, unbiased=False)
            assert module.running_mean is not None and module.running_var is not None
            self._terms[index] = torch.linalg.vector_norm(
                mean - module.running_mean.to(mean.dtype)
            ) + torch.linalg.vector_norm(var - module.running_var.to(var.dtype))

        return hook

    def clear(self) -> None:
        """Forget the recorded statistics."""
        self._terms = {}

    def loss(self, first: float = 1.0) -> torch.Tensor:
        """``sum_l ||mu_l - running_mean_l||_2 + ||var_l - running_var_l||_2``, 0-dim, each
        teacher's first BatchNorm layer weighted by ``first`` (DeepInversion's 10).

        Differentiable with respect to the teachers' inputs; a zero tensor when nothing was
        recorded (no BN layer, or no forward pass since the last :meth:`clear`).
        """
        if not self._terms:
            return torch.zeros(())
        terms = [v * (first if i in self._first else 1.0) for i, v in self._terms.items()]
        return torch.stack(terms).sum()


def reinitialise(module: nn.Module, rng: torch.Generator) -> None:
    """DCGAN initialisation in place, drawn from ``rng``: convolution and linear weights
    N(0, 0.02²), their biases 0; BatchNorm weights N(1, 0.02²), biases 0 (running statistics
    reset)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Conv2d | nn.ConvTranspose2d | nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=rng) * 0.02)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.weight is not None:
                m.weight.copy_(1 + torch.randn(m.weight.shape, generator=rng) * 0.02)
                m.bias.zero_()
                m.reset_running_stats()


def ods_perturbation(
    teacher: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    epsilon: float,
    temperature: float,
    rng: torch.Generator,
) -> torch.Tensor:
    """Output-diversified sampling (Tashiro et al. 2020) as Co-Boosting uses it: a random
    direction w ~ U(−1, 1)^{B×C} of the teacher's softmax(f(x)/T), one signed-gradient step of
    size ``epsilon``: ``x + ε·sign(∇ₓ Σ w ⊙ softmax(f(x)/T))``, detached."""
    x = x.detach().requires_grad_(True)
    probs = torch.softmax(teacher(x) / temperature, dim=-1)
    w = (torch.rand(probs.shape, generator=rng) * 2 - 1).to(probs.device, probs.dtype)
    (grad,) = torch.autograd.grad((w * probs).sum(), x)
    return (x + epsilon * grad.sign()).detach()
