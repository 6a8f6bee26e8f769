"""FedCGS, "Capture Global Feature Statistics for One-Shot Federated Learning" (Guan, Zhou and
Gu, AAAI 2025; authors' code ``Yuqin-G/FedCGS``): clients send the class statistics of a shared
frozen backbone's features, and the server writes a linear Gaussian classifier on those
features down in closed form — no training anywhere.

Every client embeds its data with the shared encoder (x = E(image), d dimensions) and sends, in
float64 as the authors' client sums them, per class c its count n_c and feature sum A_c = Σ x,
and the Gram matrix of all its features B = Σ x xᵀ — GH-OFL's ``lda`` message exactly
(:func:`oneshotfl.methods.ghofl.class_statistics`; the authors' client also sends Σ x, which is
Σ_c A_c and is not sent here). The server adds them up over the clients, so the head depends
only on the sums and is the head fitted on the pooled data whatever the partition, and forms,
with N_c = Σ n_c and N = Σ N_c:

* the class means μ_c = A_c / N_c and the global mean μ̄ = Σ_c A_c / N;
* the **total** covariance Σ_T = (B − N μ̄ μ̄ᵀ) / (N − 1) (:func:`total_covariance`): the
  features' covariance around the global mean, the between-class scatter included — the
  authors' estimator (``main_fedcgs.py`` 86–92), where GH-OFL uses the pooled within-class
  one;
* S = Σ_T + γI (``ridge`` γ; the authors' only value is 0) + εI, and the head
  logit_c(x) = μ_cᵀ S⁻¹ x − ½ μ_cᵀ S⁻¹ μ_c + log π_c with π_c = N_c / N
  (:func:`~oneshotfl.methods.ghofl.lda_weights`; the authors' ``eval``, ``utils_fl.py``
  270–281). The paper calls it a Gaussian classifier; it is linear discriminant analysis with
  one full shared covariance.

Where this differs from the authors' code, each to keep a run from failing where theirs would:

* ε = ``eps`` (10⁻⁶) is added before the solve and Σ_T is first projected onto the positive
  semi-definite cone (a no-op on honest statistics): with γ = 0 and fewer examples than
  dimensions their explicit inverse of a singular Σ_T fails or is meaningless, and a client's
  Gram that is no Gram could make it indefinite (with fewer examples than dimensions Σ_T is
  singular and the head fits poorly at ε alone: set ``ridge`` above 0 there);
* a class no client holds gets the mean 0 and the prior log 10⁻¹² (as GH-OFL); in their code its
  mean is 0/0 and its bias −∞, and its NaN logits win every argmax;
* S⁻¹ is applied by a solve, not an explicit inverse (the same to float precision on a
  well-conditioned S), and the head is evaluated in float32 on the run's device (theirs: the
  weights in float32, as here).

Not in their code, so not here: the paper's personalisation round and its secure aggregation
of the sums (the sums are sent in the clear).

Privacy: the statistics are data-like. A class a client holds once is sent as that example's
features exactly (A_c = x); the Gram matrix reveals the features' second moments; nothing is
noised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import client_embeddings, encoded_head
from oneshotfl.methods.ghofl import (
    GaussianHead,
    GhOfl,
    GhOflConfig,
    class_statistics,
    lda_weights,
    psd_part,
    summed_statistics,
)
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.contract import ClientContext, Method, Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.spec import PayloadSpec, WireDims

STATISTICS = ("counts", "sums", "gram")
"""What a client sends (GH-OFL's ``lda`` message)."""


@dataclass(frozen=True)
class FedCgsConfig(Params):
    """FedCGS's closed-form head (names as in the module docs).

    Attributes:
        ridge: γ, added to the total covariance's diagonal (the authors' code: 0).
        eps: ε, added before the solve so that no solve meets a singular matrix (not in the
            authors' code; see the module docs).
    """

    ridge: float = 0.0
    eps: float = 1e-6

    def validate(self) -> None:
        require(self.ridge >= 0, "ridge", ">= 0", self.ridge)
        require(self.eps > 0, "eps", "> 0", self.eps)


def total_covariance(gram: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Σ_T = (B − N μ̄ μ̄ᵀ) / (N − 1) with μ̄ = Σ_c A_c / N, symmetrised (the divisor at least 1)."""
    n = float(counts.sum())
    mean = sums.sum(0) / max(n, 1.0)
    cov = (gram - n * np.outer(mean, mean)) / max(n - 1.0, 1.0)
    return (cov + cov.T) / 2


def fedcgs_head(
    stats: Mapping[str, np.ndarray], cfg: FedCgsConfig
) -> tuple[GaussianHead, dict[str, float]]:
    """The server's linear head from the summed statistics, and what it says about them."""
    counts = stats["counts"].astype(np.float64)
    means = stats["sums"] / np.maximum(counts, 1)[:, None]
    log_prior = np.log(np.maximum(counts / counts.sum(), 1e-12))
    cov = psd_part(total_covariance(stats["gram"], stats["sums"], counts))
    cov += cfg.ridge * np.eye(len(cov))
    weight, bias = lda_weights(cov, means, log_prior, cfg.eps)
    head = GaussianHead("lda", {"weight": torch.from_numpy(weight), "bias": torch.from_numpy(bias)})
    info = {"classes_present": float((counts > 0).sum()), "examples": float(counts.sum())}
    return head, info


@register_method("fedcgs", "FedCGS: global feature statistics of the shared encoder, an LDA head")
class FedCgs(Method[FedCgsConfig]):
    """FedCGS's training-free head on the shared frozen encoder (see the module docs)."""

    cost = (
        "clients: embed their shard once (O(N)) and sum class statistics (O(N·d²)); "
        "server: O(n·d²) to add them up and one d×d solve, independent of N"
    )

    Config = FedCgsConfig
    requires = Requires(shared_encoder=True)

    def payload_spec(self, dims: WireDims) -> PayloadSpec:
        """GH-OFL's ``lda`` message: bounded counts, float64 sums and Gram, checked on the
        wire (a client that lies about its shapes, counts or dtypes is refused)."""
        return GhOfl(GhOflConfig(head="lda")).payload_spec(dims)

    def client_update(self, ctx: ClientContext) -> Payload:
        z = client_embeddings(ctx).numpy()
        y = ctx.data.y.numpy()
        return class_statistics(z, y, ctx.task.num_classes, "lda")

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        head, info = fedcgs_head(summed_statistics(payloads, STATISTICS), self.config)
        return GlobalModel(encoded_head(ctx, head.eval()), info=info)
