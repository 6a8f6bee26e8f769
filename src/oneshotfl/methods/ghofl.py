"""GH-OFL's closed-form Gaussian heads (Turazza, Picone and Mamei, ICLR 2026; authors' code
``FabioTur-dev/One-Shot-FL``): clients send class statistics of a shared frozen encoder's
features, and the server writes a classifier on those features down in closed form.

Every client embeds its data with the shared encoder (x = E(image), d dimensions) and sends,
per class c, its count n_c and feature sum A_c = Σ x, plus what the chosen head needs (float64,
as the authors' client sums them):

* ``head=nb`` — the sums of squares Q_c = Σ x ⊙ x;
* ``head=lda`` (default) — the Gram matrix of all its features, B = Σ x xᵀ;
* ``head=qda`` — the per-class Gram matrices S_c = Σ_{y=c} x xᵀ.

The server adds them up over the clients — so its head depends only on the sums and equals the
head fitted on the pooled data, whatever the partition (GH-OFL's point) — and forms, with
N_c = Σ n_c, N = Σ N_c, π_c = max(N_c / N, 10⁻¹²):

* μ_c = A_c / max(N_c, 1);
* Σ_pool = (B − Σ_c N_c μ_c μ_cᵀ) / (N − C), the pooled within-class covariance
  (:func:`pooled_covariance`; B = Σ_c S_c under ``qda``);
* NB: v_c = max(Q_c / N_c − μ_c², ε) and logit_c(x) = log π_c − ½ Σ_j (x_j − μ_cj)² / v_cj
  − ½ Σ_j log v_cj (:func:`naive_bayes_logits`);
* LDA: S = shrink(Σ_pool, ``lda_shrink``) + εI, logit_c(x) = xᵀ S⁻¹ μ_c − ½ μ_cᵀ S⁻¹ μ_c
  + log π_c (:func:`lda_weights`);
* QDA: Σ_c = (S_c − N_c μ_c μ_cᵀ) / (N_c − 1) where N_c > 1, else Σ_pool (the fallback for a
  class seen once); S_c = shrink(Σ_c, ``qda_shrink``) + εI and logit_c(x) = log π_c − ½ (x −
  μ_c)ᵀ S_c⁻¹ (x − μ_c) − ½ log|S_c| (:func:`qda_logits`);

with shrink(S, a) = (1 − a) S + a (tr S / d) I and ε = ``eps`` (10⁻⁶, the authors' floor), so
no solve meets a singular matrix and no weight is NaN. Each covariance is first projected
onto the positive semi-definite cone (:func:`psd_part`; a no-op on honest statistics), so a
client's Gram that is no Gram (negative eigenvalues) cannot make the Cholesky factor fail.
Defaults are the authors' YAML: ``lda_shrink`` 0.05, ``qda_shrink`` 0.1. Linear algebra runs
in float64 on the CPU.

A class no client holds is *not* ruled out, in ours as in the authors' code (their
``aggregate_clients_x`` clamps the prior and the count the same way): its mean is the origin
(μ_c = 0) and its prior costs only log 10⁻¹² ≈ −27.6 nats. Its LDA logit is that constant
everywhere, so it is predicted wherever every present class's logit falls below −27.6, as
for features near the origin and far from all the present classes' means. Under NB its
variances are all ε (at the origin its logit gains ½·d·log(1/ε) ≈ 6.9·d nats, and loses
½‖x‖²/ε away from it); under QDA its covariance is Σ_pool. ``classes_present`` in a run's
diagnostics says whether a class was absent.

Against the authors' code (read through notes/issue-43/statistics-distilled-aggregator.md,
commit fd6daf2 of their repository): the same statistics, estimators, shrinkage, ε and
fallback; where it differs — a client sends only its head's second moments (theirs sends all
of them, so their bytes are those of ``qda`` plus the rest); N − C counts the classes present
(theirs counts every class, the same when all are present); the heads evaluate in float32 on
the run's device (theirs: NB in float64, QDA in float32 on the GPU).

Not built yet: the authors' trained heads on Gaussian samples in a Fisher subspace
(FisherMix, Proto-Hyper), which their tables report next to these closed forms.

Privacy: the statistics are data-like. A class a client holds once is sent as that example's
features exactly (A_c = x); a Gram matrix reveals the features' second moments. Nothing is
noised (the authors' earlier random projection used a public seed and hid nothing either).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import client_embeddings, encoded_head
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import ArraySpec, PayloadError, PayloadSpec, WireDims

Head = Literal["nb", "lda", "qda"]
SECOND_MOMENT = {"nb": "sumsq", "lda": "gram", "qda": "grams"}
"""What each head needs beside the counts and sums."""


@dataclass(frozen=True)
class GhOflConfig(Params):
    """GH-OFL's closed-form heads (names as in the module docs).

    Attributes:
        head: the closed form: ``nb`` (diagonal Gaussians), ``lda`` (a shared covariance) or
            ``qda`` (a covariance per class).
        lda_shrink: a, the shrinkage of the pooled covariance towards (tr Σ / d) I for LDA.
        qda_shrink: the shrinkage of each class covariance for QDA.
        eps: ε, added to every matrix before a solve, and the floor of NB's variances.
    """

    head: Head = "lda"
    lda_shrink: float = 0.05
    qda_shrink: float = 0.1
    eps: float = 1e-6

    def validate(self) -> None:
        for name in ("lda_shrink", "qda_shrink"):
            value = getattr(self, name)
            require(0 <= value <= 1, name, "in [0, 1]", value)
        require(self.eps > 0, "eps", "> 0", self.eps)


def class_statistics(z: np.ndarray, y: np.ndarray, classes: int, head: Head) -> Payload:
    """A client's message: counts, per-class sums and the head's second moments (float64)."""
    x = z.astype(np.float64)
    onehot = np.eye(classes)[y]  # [n, C]
    arrays: dict[str, np.ndarray] = {
        "counts": onehot.sum(0).astype(np.int64),
        "sums": onehot.T @ x,
    }
    if head == "nb":
        arrays["sumsq"] = onehot.T @ (x * x)
    elif head == "lda":
        arrays["gram"] = x.T @ x
    else:
        arrays["grams"] = np.stack([x[y == c].T @ x[y == c] for c in range(classes)])
    return Payload(arrays)


def summed_statistics(
    payloads: Mapping[int, Payload],
    names: Sequence[str],
    stats: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The clients' statistics ``names`` summed, in place, one client's at a time (no stacked
    copy of n Gram matrices), onto ``stats`` (the sums so far) when given."""
    stats = {} if stats is None else stats
    for c in sorted(payloads):
        for k in names:
            value = np.asarray(payloads[c].arrays[k])
            stats[k] = value.copy() if k not in stats else np.add(stats[k], value, out=stats[k])
    return stats


class StatisticsFold(Fold):
    """GH-OFL's server step folded (:mod:`oneshotfl.protocol.fold`): the clients' counts,
    sums and second moments added in place as each payload arrives (as
    :func:`summed_statistics`), the Gaussian head fitted once at the end."""

    def __init__(self, ctx: ServerContext, cfg: GhOflConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.names = ("counts", "sums", SECOND_MOMENT[cfg.head])
        self.stats: dict[str, np.ndarray] = {}

    def add(self, client_id: int, payload: Payload) -> None:
        for name in self.names:  # checked before anything is added
            value = payload.arrays.get(name)
            want = None if name not in self.stats else self.stats[name].shape
            if value is None or (want is not None and np.shape(value) != want):
                got = "none" if value is None else f"shape {np.shape(value)}"
                raise PayloadError(name, f"statistics of shape {want}", got, client_id)
        self.stats = summed_statistics({client_id: payload}, self.names, self.stats)

    def finish(self) -> Outcome:
        head, info = gaussian_head(self.stats, self.cfg)
        return GlobalModel(
            encoded_head(self.ctx, head.eval()), info={"head": self.cfg.head, **info}
        )


def shrink(cov: np.ndarray, a: float) -> np.ndarray:
    """shrink(S, a) = (1 − a) S + a (tr S / d) I."""
    d = cov.shape[-1]
    return (1 - a) * cov + a * (np.trace(cov) / d) * np.eye(d)


def psd_part(matrix: np.ndarray) -> np.ndarray:
    """The nearest positive semi-definite matrix to the symmetric part of ``matrix``
    (negative eigenvalues set to 0): what a client's non-PSD Gram leaves of a covariance."""
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    return (vectors * np.maximum(values, 0)) @ vectors.T


def pooled_covariance(gram: np.ndarray, counts: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Σ_pool = (B − Σ_c N_c μ_c μ_cᵀ) / (N − C), symmetrised (C: the classes present)."""
    present = int((counts > 0).sum())
    scatter = gram - (means.T * counts) @ means
    cov = scatter / max(float(counts.sum()) - present, 1.0)
    return (cov + cov.T) / 2


def naive_bayes_logits(
    x: torch.Tensor, means: torch.Tensor, variances: torch.Tensor, log_prior: torch.Tensor
) -> torch.Tensor:
    """log π_c − ½ Σ_j (x_j − μ_cj)² / v_cj − ½ Σ_j log v_cj, ``[N, C]``."""
    diff = x[:, None, :] - means[None]
    return log_prior - 0.5 * (diff**2 / variances).sum(-1) - 0.5 * variances.log().sum(-1)


def lda_weights(
    cov: np.ndarray, means: np.ndarray, log_prior: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """W = S⁻¹ μᵀ ``[d, C]`` and b_c = −½ μ_cᵀ S⁻¹ μ_c + log π_c, S = cov + εI."""
    solved = np.linalg.solve(cov + eps * np.eye(len(cov)), means.T)
    return solved, -0.5 * np.einsum("cd,dc->c", means, solved) + log_prior


def qda_logits(
    x: torch.Tensor, means: torch.Tensor, factors: torch.Tensor, log_prior: torch.Tensor
) -> torch.Tensor:
    """log π_c − ½ (x − μ_c)ᵀ S_c⁻¹ (x − μ_c) − ½ log|S_c|, with L_c the Cholesky factor of S_c
    (``factors`` ``[C, d, d]``), ``[N, C]``."""
    diff = (x[None] - means[:, None, :]).transpose(1, 2)  # [C, d, N]
    white = torch.linalg.solve_triangular(factors, diff, upper=False)
    logdet = 2 * torch.diagonal(factors, dim1=1, dim2=2).log().sum(-1)
    return (log_prior - 0.5 * logdet)[None] - 0.5 * (white**2).sum(1).T


class GaussianHead(nn.Module):
    """One of GH-OFL's closed-form heads on d-dimensional features (its tensors as buffers)."""

    def __init__(self, head: Head, tensors: Mapping[str, torch.Tensor]) -> None:
        super().__init__()
        self.kind = head
        for name, value in tensors.items():
            self.register_buffer(name, value.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = dict(self.named_buffers())
        if self.kind == "lda":
            return x @ b["weight"] + b["bias"]
        if self.kind == "nb":
            return naive_bayes_logits(x, b["means"], b["variances"], b["log_prior"])
        return qda_logits(x, b["means"], b["factors"], b["log_prior"])


def gaussian_head(
    stats: Mapping[str, np.ndarray], cfg: GhOflConfig
) -> tuple[GaussianHead, dict[str, float]]:
    """The server's head from the summed statistics, and what it says about them."""
    counts = stats["counts"].astype(np.float64)
    means = stats["sums"] / np.maximum(counts, 1)[:, None]
    log_prior = np.log(np.maximum(counts / counts.sum(), 1e-12))
    d, eps = means.shape[1], cfg.eps
    once = int(((counts > 0) & (counts < 2)).sum())
    info = {"classes_present": float((counts > 0).sum()), "classes_seen_once": float(once)}
    as_torch = {"means": torch.from_numpy(means), "log_prior": torch.from_numpy(log_prior)}
    if cfg.head == "nb":
        second = stats["sumsq"] / np.maximum(counts, 1)[:, None] - means**2
        variances = torch.from_numpy(np.maximum(second, eps))
        return GaussianHead("nb", {**as_torch, "variances": variances}), info
    gram = stats["gram"] if cfg.head == "lda" else stats["grams"].sum(0)
    pooled = pooled_covariance(gram, counts, means)
    if cfg.head == "lda":
        weight, bias = lda_weights(shrink(psd_part(pooled), cfg.lda_shrink), means, log_prior, eps)
        tensors = {"weight": torch.from_numpy(weight), "bias": torch.from_numpy(bias)}
        return GaussianHead("lda", tensors), info
    factors = []
    for c in range(len(counts)):
        outer = counts[c] * np.outer(means[c], means[c])
        cov = (stats["grams"][c] - outer) / (counts[c] - 1) if counts[c] > 1 else pooled
        cov = shrink(psd_part(cov), cfg.qda_shrink) + eps * np.eye(d)
        factors.append(np.linalg.cholesky(cov))
    tensors = {**as_torch, "factors": torch.from_numpy(np.stack(factors))}
    return GaussianHead("qda", tensors), info


@register_method("ghofl", "GH-OFL: class statistics of the shared encoder, closed-form heads")
class GhOfl(Method[GhOflConfig]):
    """GH-OFL's closed-form Gaussian heads on the shared frozen encoder (see the module docs)."""

    cost = (
        "clients: embed their shard once (O(N)) and sum class statistics (O(N·d²) for lda/qda); "
        "server: O(n·C·d²) to add them up, folded as they arrive (one client's held at a time), "
        "and one d×d solve (C for qda), independent of N"
    )

    Config = GhOflConfig
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        most = dims.max_examples or 2**31
        counts = ArraySpec("counts", ("C",), ("int64",), (0, most), min_sum=1, max_sum=most)
        shapes = {"sumsq": ("C", "D"), "gram": ("D", "D"), "grams": ("C", "D", "D")}
        second = SECOND_MOMENT[self.config.head]
        moments = ArraySpec(second, shapes[second], ("float64",))
        return PayloadSpec(arrays=(counts, ArraySpec("sums", ("C", "D"), ("float64",)), moments))

    def client_update(self, ctx: ClientContext) -> Payload:
        z = client_embeddings(ctx).numpy()
        y = ctx.data.y.numpy()
        return class_statistics(z, y, ctx.task.num_classes, self.config.head)

    def fold(self, ctx: ServerContext) -> Fold:
        """The statistics summed as the payloads arrive (:class:`StatisticsFold`)."""
        return StatisticsFold(ctx, self.config)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return fold_all(self.fold(ctx), payloads)
