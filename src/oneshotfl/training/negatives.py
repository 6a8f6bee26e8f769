"""Open-set negatives: outliers a client makes from its own data for an "unknown" class.

FedOV (Diao, Li & He, ICLR 2023, "Towards Addressing Label Skews in One-Shot Federated
Learning", OpenReview rzrqh85f4Sc) and FedEOV (its extension; an anonymous manuscript with
its appendix, unpublished as far as we could find) train each
client as a (C+1)-way classifier whose extra class, index C, is "unknown"; the negatives are
corrupted copies of the client's own images:

* :func:`corrupt` — one of seven corruptions per image, chosen uniformly: a random resized
  crop (scale 0.1–0.33), a Gaussian blur, random erasing (scale 0.33–0.5), and a *cut* and a
  *rot* entry listed twice each (both papers' list). ``style`` picks whose versions: ``fedeov``
  (blur kernel 3/5/7 with σ ~ U(0.1, 2); cut copies a half-width vertical strip; rot turns one
  half-size square on the diagonal by 90°·k) or ``fedov`` (an anisotropic, nearly box blur
  with σ ~ U(10, 100); cut copies a strip at least a quarter side away or swaps the halves,
  vertically or horizontally; rot turns the two half-size squares of a row band).
* :func:`jigsaw` — the image cut into ``grid × grid`` patches put back in a random non-identity
  order; with ``smooth`` the bands of 5 pixels around every inner seam are replaced by a
  Gaussian blur (kernel 5, σ ~ U(0.1, 2) per image) of the shuffled image.
* :func:`oneshotfl.training.components.sign_gradient_steps` — FGSM steps on the negatives
  (see :class:`NegativesConfig` for the two directions).

Every geometric corruption is one gather through a per-image source-index map, so a batch is
corrupted without a Python loop over images; all randomness comes from the component's
stream. Deviations from the authors' code (documented in the methods' docs): images stay in
our normalised units (erasing writes 0, the mean), the FedEOV seam blur sees the whole image
rather than the 5-pixel band alone, and one σ is drawn per image rather than per seam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from oneshotfl.params import Params, require
from oneshotfl.training.components import (
    Component,
    register_component,
    require_unknown_output,
    sign_gradient_steps,
)

CORRUPTIONS = ("crop", "blur", "erase", "cut", "rot", "cut", "rot")

LEAST_SIDE = {"fedov": 5, "fedeov": 4}
"""The least image side each style's corruptions take: the blur pads by half its largest
kernel in reflect mode, which needs the pad below the side (``fedov``: 9, pad 4; ``fedeov``:
7, pad 3), and ``fedov``'s cut draws two strips at least a quarter side apart (on a side of 2
or 3 it draws for ever). The jigsaw needs a side of at least its ``grid``."""


def _uniform(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)


def _ints(n: int, lo: int, hi: int, g: torch.Generator) -> torch.Tensor:
    """``n`` integers uniform in ``[lo, hi]``."""
    return torch.randint(lo, hi + 1, (n,), generator=g)


def gather_pixels(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``out[b, :, i, j] = x[b, :, rows[b, i, j], cols[b, i, j]]`` for ``[B, C, H, W]`` images."""
    b, c, h, w = x.shape
    flat = (rows * w + cols).view(b, 1, h * w).expand(b, c, h * w).to(x.device)
    return x.reshape(b, c, h * w).gather(2, flat).view(b, c, h, w)


def _grid(b: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.arange(h).view(1, h, 1).expand(b, h, w).clone()
    cols = torch.arange(w).view(1, 1, w).expand(b, h, w).clone()
    return rows, cols


def rotate_square(
    rows: torch.Tensor, cols: torch.Tensor, top: int, left: int, side: int, turns: int
) -> None:
    """In place: the source map of one image turns its ``side``-square at (top, left) by
    ``turns`` × 90° (counter-clockwise, as ``torch.rot90``)."""
    i = torch.arange(side).view(side, 1).expand(side, side)
    j = torch.arange(side).view(1, side).expand(side, side)
    for _ in range(turns % 4):  # out[i, j] = in[j, side-1-i] per quarter turn
        i, j = j, side - 1 - i
    rows[top : top + side, left : left + side] = top + i
    cols[top : top + side, left : left + side] = left + j


def _cut_rot(x: torch.Tensor, kind: str, style: str, g: torch.Generator) -> torch.Tensor:
    b, _, h, w = x.shape
    rows, cols = _grid(b, h, w)
    half_h, half_w = h // 2, w // 2
    for n in range(b):
        if kind == "rot":
            turns = int(_ints(1, 1, 3, g))
            if style == "fedeov":
                pl = int(_ints(1, 0, half_h - 1, g))
                rotate_square(rows[n], cols[n], pl, min(pl, w - half_h), half_h, turns)
            else:
                pl = int(_ints(1, 0, h - half_h, g))
                side = min(half_h, half_w)
                rotate_square(rows[n], cols[n], pl, 0, side, turns)
                rotate_square(rows[n], cols[n], pl, w - side, side, turns)
            continue
        variant = 0 if style == "fedeov" else int(_ints(1, 0, 5, g))
        vertical = variant in (0, 1, 2)
        side, half = (w, half_w) if vertical else (h, half_h)
        idx = torch.arange(side)
        if variant in (2, 5):  # swap the two halves
            src = (idx + half) % side if side % 2 == 0 else idx.flip(0)
        else:
            dst, from_ = (int(v) for v in _ints(2, 0, half - 1, g))
            if style == "fedov":  # at least half/2 apart
                while abs(dst - from_) < max(1, half // 2):
                    dst, from_ = (int(v) for v in _ints(2, 0, half - 1, g))
            src = idx.clone()
            src[dst : dst + half] = torch.arange(from_, from_ + half)
        if vertical:
            cols[n] = src.view(1, w).expand(h, w)
        else:
            rows[n] = src.view(h, 1).expand(h, w)
    return gather_pixels(x, rows, cols)


def gaussian_kernels(
    sigma_y: torch.Tensor, sigma_x: torch.Tensor, ky: int, kx: int
) -> torch.Tensor:
    """Normalised ``[B, ky, kx]`` Gaussian kernels with per-image σ."""
    gy = torch.arange(ky, dtype=torch.float64, device=sigma_y.device) - (ky - 1) / 2
    gx = torch.arange(kx, dtype=torch.float64, device=sigma_x.device) - (kx - 1) / 2
    ey = torch.exp(-(gy.view(1, -1) ** 2) / (2 * sigma_y.view(-1, 1) ** 2))
    ex = torch.exp(-(gx.view(1, -1) ** 2) / (2 * sigma_x.view(-1, 1) ** 2))
    k = ey.unsqueeze(2) * ex.unsqueeze(1)
    return k / k.sum(dim=(1, 2), keepdim=True)


def blur_images(x: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """Each image convolved with its own ``[ky, kx]`` kernel (reflect padding, per channel)."""
    b, c, h, w = x.shape
    ky, kx = kernels.shape[1:]
    weight = kernels.to(x.dtype).to(x.device).repeat_interleave(c, 0).unsqueeze(1)
    padded = F.pad(x.reshape(1, b * c, h, w), (kx // 2, kx // 2, ky // 2, ky // 2), "reflect")
    return F.conv2d(padded, weight, groups=b * c).view(b, c, h, w)


def _blur(x: torch.Tensor, style: str, g: torch.Generator) -> torch.Tensor:
    b = len(x)
    out = torch.empty_like(x)
    if style == "fedeov":
        sizes, sigma = _ints(b, 0, 2, g) * 2 + 3, _uniform(b, 0.1, 2.0, g)
        for k in (3, 5, 7):
            sel = (sizes == k).nonzero().flatten()
            if len(sel):
                kern = gaussian_kernels(sigma[sel], sigma[sel], k, k)
                out[sel] = blur_images(x[sel], kern)
        return out
    big, small = _ints(b, 1, 4, g) * 2 + 1, _ints(b, 0, 2, g) * 2 + 1
    swap, sigma = torch.rand(b, generator=g) < 0.5, _uniform(b, 10.0, 100.0, g)
    for n in range(b):  # kernel (big, small) or (small, big): nearly a box blur
        ky, kx = (int(big[n]), int(small[n])) if swap[n] else (int(small[n]), int(big[n]))
        kern = gaussian_kernels(sigma[n : n + 1], sigma[n : n + 1], ky, kx)
        out[n : n + 1] = blur_images(x[n : n + 1], kern)
    return out


def _crop(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random resized crop: area scale U(0.1, 0.33), log-uniform aspect ratio in [3/4, 4/3],
    resized back bilinearly (one ``grid_sample`` for the batch)."""
    b = len(x)
    area = _uniform(b, 0.1, 0.33, g)
    ratio = torch.exp(_uniform(b, math.log(3 / 4), math.log(4 / 3), g))
    fw, fh = (area * ratio).sqrt().clamp(max=1.0), (area / ratio).sqrt().clamp(max=1.0)
    cx = (torch.rand(b, generator=g, dtype=torch.float64) * 2 - 1) * (1 - fw)
    cy = (torch.rand(b, generator=g, dtype=torch.float64) * 2 - 1) * (1 - fh)
    theta = torch.zeros(b, 2, 3, dtype=torch.float64)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = fw, cx, fh, cy
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid.to(x.device), mode="bilinear", align_corners=False)


def _erase(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random erasing (p = 1): a rectangle of area scale U(0.33, 0.5) and log-uniform aspect
    ratio in [0.3, 3.3] set to 0 (the normalised mean)."""
    b, _, h, w = x.shape
    area = _uniform(b, 0.33, 0.5, g) * h * w
    ratio = torch.exp(_uniform(b, math.log(0.3), math.log(3.3), g))
    eh = (area * ratio).sqrt().round().clamp(1, h).long()
    ew = (area / ratio).sqrt().round().clamp(1, w).long()
    top = (torch.rand(b, generator=g) * (h - eh + 1).float()).long()
    left = (torch.rand(b, generator=g) * (w - ew + 1).float()).long()
    r, c = torch.arange(h).view(1, h, 1), torch.arange(w).view(1, 1, w)
    inside = (
        (r >= top.view(-1, 1, 1))
        & (r < (top + eh).view(-1, 1, 1))
        & (c >= left.view(-1, 1, 1))
        & (c < (left + ew).view(-1, 1, 1))
    )
    return x.masked_fill(inside.unsqueeze(1).to(x.device), 0.0)


def corrupt(x: torch.Tensor, style: str, g: torch.Generator) -> torch.Tensor:
    """One uniformly chosen corruption of :data:`CORRUPTIONS` per image (see the module docs)."""
    if style not in ("fedeov", "fedov"):
        raise ValueError(f"corrupt: expected style 'fedeov' or 'fedov', got {style!r}")
    choice = torch.randint(0, len(CORRUPTIONS), (len(x),), generator=g)
    out = torch.empty_like(x)
    for kind in dict.fromkeys(CORRUPTIONS):
        codes = [i for i, k in enumerate(CORRUPTIONS) if k == kind]
        sel = torch.isin(choice, torch.tensor(codes)).nonzero().flatten()
        if not len(sel):
            continue
        part = x[sel.to(x.device)]
        if kind == "crop":
            done = _crop(part, g)
        elif kind == "blur":
            done = _blur(part, style, g)
        elif kind == "erase":
            done = _erase(part, g)
        else:
            done = _cut_rot(part, kind, style, g)
        out[sel.to(x.device)] = done
    return out


def jigsaw(x: torch.Tensor, grid: int, g: torch.Generator, smooth: bool = True) -> torch.Tensor:
    """Shuffled-patch negatives (see the module docs). The image side must be divisible by
    ``grid`` (a remainder border is left in place). Without ``smooth`` every output image is
    a permutation of its input's patches, never the identity."""
    b, _, h, w = x.shape
    require(grid >= 2 and h >= grid and w >= grid, "grid", f"in [2, {min(h, w)}]", grid)
    ph, pw = h // grid, w // grid
    k = grid * grid
    perms = torch.stack([torch.randperm(k, generator=g) for _ in range(b)])
    ident = (perms == torch.arange(k)).all(1)
    perms[ident] = perms[ident].roll(1, dims=1)  # never the identity
    rows, cols = _grid(b, h, w)
    r, c = torch.arange(grid * ph), torch.arange(grid * pw)
    patch = (r // ph).view(-1, 1) * grid + (c // pw).view(1, -1)  # [gh, gw] target patch ids
    src = perms[:, patch.flatten()].view(b, grid * ph, grid * pw)  # source patch per pixel
    rows[:, : grid * ph, : grid * pw] = (src // grid) * ph + (r % ph).view(1, -1, 1)
    cols[:, : grid * ph, : grid * pw] = (src % grid) * pw + (c % pw).view(1, 1, -1)
    out = gather_pixels(x, rows, cols)
    if not smooth:
        return out
    sigma = _uniform(b, 0.1, 2.0, g)
    blurred = blur_images(out, gaussian_kernels(sigma, sigma, 5, 5))
    band = torch.zeros(h, w, dtype=torch.bool)
    for i in range(1, grid):
        band[max(0, i * ph - 2) : i * ph + 3, :] = True
        band[:, max(0, i * pw - 2) : i * pw + 3] = True
    return torch.where(band.to(x.device), blurred, out)


@dataclass(frozen=True)
class NegativesConfig(Params):
    """Parameters of the open-set negatives stream.

    Attributes:
        corrupt: append one corrupted copy of every image (:func:`corrupt`).
        style: whose corruptions: ``fedeov`` or ``fedov`` (see the module docs).
        jigsaw: append one shuffled-patch copy of every image (:func:`jigsaw`).
        grid: patches per side of the jigsaw.
        smooth: blur the jigsaw's seams.
        fgsm_steps: FGSM steps on the negatives (0 = none).
        fgsm_step: size of one step, in normalised input units.
        fgsm_epsilon: L∞ bound of the whole perturbation.
        fgsm: ``away_unknown`` ascends the loss of the unknown class (the authors' code: its
            "targeted" attack targets the unknown label with the sign flipped twice, FedOV's
            untargeted attack) or ``toward_source`` descends the loss of the class each
            negative was made from (a targeted attack towards the known class).
        keep_clean: also keep the negatives before the attack (FedOV keeps both).
        bn: how BatchNorm sees the negatives' attack: ``eval`` (running statistics used and
            untouched) or ``code`` (the FedEOV code: the attack runs in training mode, so
            batch statistics are used and the running statistics move towards the
            negatives, and every step also passes the real batch alone through the model
            in training mode, its accuracy bookkeeping, which moves them back).
    """

    corrupt: bool = True
    style: Literal["fedeov", "fedov"] = "fedeov"
    jigsaw: bool = False
    grid: int = 4
    smooth: bool = True
    fgsm_steps: int = 0
    fgsm_step: float = 0.002
    fgsm_epsilon: float = 0.5
    fgsm: Literal["away_unknown", "toward_source"] = "away_unknown"
    keep_clean: bool = False
    bn: Literal["eval", "code"] = "eval"

    def validate(self) -> None:
        require(self.corrupt or self.jigsaw, "corrupt/jigsaw", "at least one on", False)
        require(self.grid >= 2, "grid", ">= 2", self.grid)
        require(self.fgsm_steps >= 0, "fgsm_steps", ">= 0", self.fgsm_steps)
        require(self.fgsm_step > 0, "fgsm_step", "> 0", self.fgsm_step)
        require(self.fgsm_epsilon > 0, "fgsm_epsilon", "> 0", self.fgsm_epsilon)


def make_negatives(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: NegativesConfig,
    unknown: int,
    g: torch.Generator,
) -> torch.Tensor:
    """The negatives of one batch: ``[jigsaw(x); corrupt(x)]`` (those switched on), then FGSM
    steps with the model in eval mode (BatchNorm statistics untouched) when ``fgsm_steps``."""
    parts, sources = [], []
    if cfg.jigsaw:
        parts.append(jigsaw(x, cfg.grid, g, cfg.smooth))
        sources.append(y)
    if cfg.corrupt:
        parts.append(corrupt(x, cfg.style, g))
        sources.append(y)
    neg = torch.cat(parts).detach()
    if cfg.fgsm_steps == 0:
        return neg
    toward = cfg.fgsm == "toward_source"
    target = torch.cat(sources) if toward else torch.full((len(neg),), unknown, device=x.device)
    was_training = model.training
    if cfg.bn == "eval":
        model.eval()
    adv = sign_gradient_steps(
        model,
        neg,
        target,
        step=cfg.fgsm_step,
        steps=cfg.fgsm_steps,
        epsilon=cfg.fgsm_epsilon,
        targeted=toward,
    )
    model.train(was_training)
    return torch.cat([neg, adv]) if cfg.keep_clean else adv


@register_component("negatives", "open-set negatives labelled 'unknown' (FedOV / FedEOV)")
class Negatives(Component):
    """Open-set negatives (see the module docs) appended to every batch with the label C."""

    Config = NegativesConfig

    def setup(self, model: nn.Module) -> None:
        require_unknown_output("negatives", "unknown", self.env)

    def extra_examples(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.bn == "code" and model.training:
            with torch.no_grad():
                model(x)  # the code's real-only forward in training mode (BN statistics)
        neg = make_negatives(model, x, y, self.config, self.env.num_classes, self.env.generator)
        return neg, torch.full((len(neg),), self.env.num_classes, dtype=y.dtype, device=y.device)
