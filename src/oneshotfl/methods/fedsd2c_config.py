"""FedSD2C's knobs (:mod:`oneshotfl.methods.fedsd2c`), with the authors' values where they have
one (``Carkham/FedSD2C`` @ 5569741: ``configs/imagenette/fedsd2c.yaml``, the 10-class column,
and ``utils/arg_parser.py``; notes/issue-52/research-fedsd2c.md §4.3), and the message they
fix on the wire (:class:`Distillates`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from oneshotfl.encoders.autoencoder import auto_downsample
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import FieldGroup, PayloadError, WireDims

PREFIX = "distillates"
LATENT_BOUND = 1e4
"""|z| at most: a latent beyond it is no posterior mean of the autoencoder's."""


@dataclass(frozen=True)
class FedSd2cConfig(Params):
    """FedSD2C hyper-parameters (names as in the module docs of :mod:`~.fedsd2c`).

    Attributes:
        autoencoder: the shared autoencoder (:mod:`oneshotfl.encoders.autoencoder`): ``public``
            (pretrained on the public pool, cached) or ``file`` (``ae_path``, written by
            ``oneshotfl encoder autoencoder``).
        ae_channels: its latent maps (``public``).
        ae_downsample: how many times smaller a latent's side is than the image's (``public``;
            0: :func:`~oneshotfl.encoders.autoencoder.auto_downsample` of the image side — 4 on
            28-pixel images, 2 on 8-pixel ones; theirs: 8, which does not divide 28).
        ae_width: its hidden channels (``public``).
        ae_epochs: its pretraining passes over the pool, at least (``public``).
        ae_min_steps: its pretraining steps, at least (``public``).
        ae_path: its file (``file``).
        ae_sha256: the file's expected content hash (``file``; "": not checked beyond the
            hash stored in the file).
        ipc: distillates per class a client holds (theirs: 50).
        mipc: examples of a class scored for the core-set, at most (theirs: 500).
        num_crop: random square crops scored per example (theirs: 10).
        crop_scale_min: the smallest crop, as a fraction of the image's area (theirs: 0.08,
            torchvision's default).
        coreset: ``vinfo`` (the crops of least cross-entropy under the client's model, i.e.
            of most pointwise V-information) or ``random`` (the ablation: random examples,
            their first crop).
        small_classes: a class with at most ``ipc`` examples: ``keep`` (all of them, their
            best crops) or ``drop`` (sends nothing for it, as the authors' ``CategoryDataset``).
        fourier: mix a donor's Fourier amplitude into each core-set crop before encoding.
        fourier_lambda: λ, the donor's share of the amplitude (theirs: 0.8).
        iterations: optimisation steps on the latents (theirs: 100).
        syn_lr: AdamW's rate on the latents, annealed by a cosine to 0 (theirs: 0.1).
        syn_weight_decay: AdamW's decoupled weight decay on the latents (theirs: PyTorch's
            default, 0.01).
        r_c: the weight of the cross-entropy term of the synthesis loss (theirs: 0 on their
            10-class Imagenette, 0.01 on Tiny-ImageNet).
        labels: what the server distils from: ``logits`` (the client's model's logits on
            each decoded distillate and its mirror image, sent with it: what their server's
            live teachers compute) or ``hard`` (the labels alone, cross-entropy).
        server_epochs: the server's passes over the decoded distillates (theirs: 100).
        server_batch: its batch size (theirs: 128).
        server_lr: its SGD rate, annealed by a cosine over the epochs (theirs: 0.02).
        server_momentum: its SGD momentum (theirs: 0.9).
        server_weight_decay: its weight decay (theirs: 1e-4).
        temperature: T of the distillation (theirs: 1).
        server_flip: mirror each example with probability 1/2 at each use (their only
            augmentation).
        arch: the server's architecture (None: the clients').
    """

    autoencoder: Literal["public", "file"] = "public"
    ae_channels: int = 4
    ae_downsample: int = 0
    ae_width: int = 32
    ae_epochs: int = 5
    ae_min_steps: int = 500
    ae_path: str = ""
    ae_sha256: str = ""
    ipc: int = 50
    mipc: int = 500
    num_crop: int = 10
    crop_scale_min: float = 0.08
    coreset: Literal["vinfo", "random"] = "vinfo"
    small_classes: Literal["keep", "drop"] = "keep"
    fourier: bool = True
    fourier_lambda: float = 0.8
    iterations: int = 100
    syn_lr: float = 0.1
    syn_weight_decay: float = 0.01
    r_c: float = 0.0
    labels: Literal["logits", "hard"] = "logits"
    server_epochs: int = 100
    server_batch: int = 128
    server_lr: float = 0.02
    server_momentum: float = 0.9
    server_weight_decay: float = 1e-4
    temperature: float = 1.0
    server_flip: bool = True
    arch: str | None = None

    def validate(self) -> None:
        require(1 <= self.ipc <= 10_000, "ipc", "in [1, 10000]", self.ipc)
        require(self.ipc <= self.mipc <= 100_000, "mipc", f"in [ipc={self.ipc}, 100000]", self.mipc)
        require(1 <= self.num_crop <= 100, "num_crop", "in [1, 100]", self.num_crop)
        require(0 < self.crop_scale_min <= 1, "crop_scale_min", "in (0, 1]", self.crop_scale_min)
        require(0 <= self.fourier_lambda <= 1, "fourier_lambda", "in [0, 1]", self.fourier_lambda)
        require(0 <= self.iterations <= 100_000, "iterations", "in [0, 100000]", self.iterations)
        require(self.syn_lr > 0, "syn_lr", "> 0", self.syn_lr)
        require(self.syn_weight_decay >= 0, "syn_weight_decay", ">= 0", self.syn_weight_decay)
        require(self.r_c >= 0, "r_c", ">= 0", self.r_c)
        require(self.server_epochs >= 1, "server_epochs", ">= 1", self.server_epochs)
        require(self.server_batch >= 1, "server_batch", ">= 1", self.server_batch)
        require(self.server_lr > 0, "server_lr", "> 0", self.server_lr)
        require(0 <= self.server_momentum < 1, "server_momentum", "in [0, 1)", self.server_momentum)
        require(
            self.server_weight_decay >= 0, "server_weight_decay", ">= 0", self.server_weight_decay
        )
        require(self.temperature > 0, "temperature", "> 0", self.temperature)
        downsample = self.ae_downsample in (0, 1, 2, 4, 8, 16)
        require(downsample, "ae_downsample", "0 (auto), 1, 2, 4, 8 or 16", self.ae_downsample)
        want_path = self.autoencoder != "file" or bool(self.ae_path)
        require(want_path, "ae_path", "a file (autoencoder=file)", self.ae_path)
        for name in ("ae_path", "ae_sha256"):
            value = getattr(self, name)
            require(":" not in value, name, "no ':' (it separates options)", value)

    def autoencoder_spec(self, image_size: int) -> str:
        """The spec of the shared autoencoder these knobs name, for images of this side."""
        if self.autoencoder == "file":
            return f"file:path={self.ae_path}" + (
                f":sha256={self.ae_sha256}" if self.ae_sha256 else ""
            )
        return (
            f"public:channels={self.ae_channels}:downsample="
            f"{self.ae_downsample or auto_downsample(image_size)}:width="
            f"{self.ae_width}:epochs={self.ae_epochs}:min_steps={self.ae_min_steps}"
        )


@dataclass(frozen=True)
class Distillates(FieldGroup):
    """``<prefix>.latents`` float32 ``[N, *latent]``, ``<prefix>.y`` int64 ``[N]`` with at most
    ``ipc`` of each class and, with ``logits``, ``<prefix>.logits`` float32 ``[N, 2, C]``:
    1 ≤ N ≤ ``ipc`` · C, every value finite, latents within ±:data:`LATENT_BOUND`."""

    prefix: str
    latent: tuple[int, int, int]
    ipc: int
    logits: bool

    def shapes(self, n: int, classes: int) -> dict[str, tuple[tuple[int, ...], str]]:
        want = {"latents": ((n, *self.latent), "float32"), "y": ((n,), "int64")}
        return want | ({"logits": ((n, 2, classes), "float32")} if self.logits else {})

    def check(self, payload: Payload, dims: WireDims, client: int | None) -> None:
        c, key = dims.num_classes, f"{self.prefix}.y"
        y = payload.arrays.get(key)
        if y is None or y.ndim != 1 or not 1 <= len(y) <= self.ipc * c:
            got = "nothing (missing)" if y is None else f"shape {y.shape}"
            raise PayloadError(
                key, f"[N] labels with 1 <= N <= ipc·C = {self.ipc * c}", got, client
            )
        want = self.shapes(len(y), c)
        sent = {k[len(self.prefix) + 1 :] for k in payload.arrays if self.owns(k)}
        for name in sorted(set(want) ^ sent):
            what = ("an array", "missing") if name in want else ("no such array", "one")
            raise PayloadError(f"{self.prefix}.{name}", *what, client)
        for name, (shape, dtype) in want.items():
            key, value = f"{self.prefix}.{name}", payload.arrays[f"{self.prefix}.{name}"]
            if value.dtype != np.dtype(dtype) or tuple(value.shape) != shape:
                raise PayloadError(key, f"{dtype} {shape}", f"{value.dtype} {value.shape}", client)
            if dtype == "float32" and not np.isfinite(value).all():
                raise PayloadError(key, "finite values", "NaN/inf entries", client)
        if y.min() < 0 or y.max() >= c:
            raise PayloadError(key, f"labels in [0, {c - 1}]", f"[{y.min()}, {y.max()}]", client)
        most = int(np.bincount(y, minlength=c).max())
        if most > self.ipc:
            raise PayloadError(key, f"at most ipc = {self.ipc} of a class", str(most), client)
        latents = payload.arrays[f"{self.prefix}.latents"]
        if float(np.abs(latents).max()) > LATENT_BOUND:
            raise PayloadError(
                f"{self.prefix}.latents", f"|z| <= {LATENT_BOUND:g}", "larger", client
            )

    def bound(self, dims: WireDims, client: int | None) -> tuple[int, int] | None:
        n = self.ipc * dims.num_classes
        row = 4 * math.prod(self.latent) + 8 + (8 * dims.num_classes if self.logits else 0)
        return n * row, len(self.shapes(n, dims.num_classes))
