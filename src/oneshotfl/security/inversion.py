"""The model-inversion audit of FedAGE (Appendix C, Eq. 8): can an uploaded latent be turned
back into the image?

Given the shared encoder E and a latent z (clean, or noised by local DP), the attacker
optimises an image x̂ to minimise ‖E(x̂) − z‖² + λ·TV(x̂) (λ = 1e-4, total variation as the
image prior) with Adam, starting from a constant grey image. Reconstructions are scored
against the originals with PSNR and SSIM on [0, 1] pixels. A positive control — the
``identity`` encoder, whose latent *is* the image — must be inverted (≥ 25 dB) for a failure
on a real encoder to mean anything.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from oneshotfl.data.feature_skew import dataset_stats
from oneshotfl.encoders.base import Encoder, preprocess_images
from oneshotfl.training import optim


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV: mean absolute difference of neighbouring pixels, per image summed."""
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs().sum(dim=(1, 2, 3))
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs().sum(dim=(1, 2, 3))
    return dh + dw


def invert(
    encoder: Encoder,
    z: torch.Tensor,
    shape: tuple[int, int, int],
    steps: int = 300,
    lr: float = 0.05,
    lam: float = 1e-4,
) -> torch.Tensor:
    """Eq. (8): argmin_x̂ ‖E(x̂) − z‖² + λ·TV(x̂), by Adam from a grey start.

    Args:
        encoder: the frozen encoder (its preprocessing is applied to x̂).
        z: target latents ``[N, d]``.
        shape: ``(C, H, W)`` of the dataset-normalised images.
        steps: optimisation steps.
        lr: Adam learning rate.
        lam: weight λ of the total-variation prior.

    Returns:
        The reconstructions ``[N, C, H, W]`` in the dataset's normalisation.
    """
    module = encoder.module.cpu().eval()
    x = torch.zeros((len(z), *shape), requires_grad=True)
    optimizer = optim.Adam([x], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        out = module(preprocess_images(x, encoder.preprocess, encoder.task)).flatten(1)
        loss = ((out - z) ** 2).sum(dim=1) + lam * total_variation(x)
        loss.sum().backward()
        optimizer.step()
    return x.detach()


def to_unit_range(x: torch.Tensor, dataset: str) -> torch.Tensor:
    """Dataset-normalised images back to [0, 1] pixels (clamped)."""
    stats = dataset_stats(dataset)
    if stats is None:
        raise ValueError(f"no normalisation known for dataset {dataset!r}")
    c = x.shape[1]
    mean = torch.tensor(stats.mean).view(1, -1, 1, 1).expand(1, c, 1, 1)
    std = torch.tensor(stats.std).view(1, -1, 1, 1).expand(1, c, 1, 1)
    return (x * std + mean).clamp(0, 1)


def psnr(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Peak signal-to-noise ratio in dB per image, pixels in [0, 1] (capped at 100 dB)."""
    mse = ((x - y) ** 2).flatten(1).mean(dim=1)
    return torch.clamp(10 * torch.log10(1.0 / mse.clamp_min(1e-10)), max=100.0)


def ssim(x: torch.Tensor, y: torch.Tensor, window: int = 7, sigma: float = 1.5) -> torch.Tensor:
    """Structural similarity (Wang et al. 2004) per image, pixels in [0, 1], Gaussian window
    (size capped by the image), constants K1 = 0.01, K2 = 0.03, averaged over channels."""
    size = min(window, x.shape[-1], x.shape[-2])
    coords = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = (g / g.sum()).outer(g / g.sum())
    c = x.shape[1]
    kernel = g.expand(c, 1, size, size)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, kernel, groups=c)

    c1, c2 = 0.01**2, 0.03**2
    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    num = (2 * mx * my + c1) * (2 * cov + c2)
    den = (mx**2 + my**2 + c1) * (vx + vy + c2)
    return (num / den).flatten(1).mean(dim=1)


def psnr_of_mse(mse: float) -> float:
    """PSNR (dB) of a mean squared error on [0, 1] pixels."""
    return 10 * math.log10(1.0 / mse)
