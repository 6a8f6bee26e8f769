"""Plugin ``fedage_authors``: FedAGE with the authors' client and server steps, unedited.

FedAGE's whole pipeline is one function, ``main()`` of ``pipeline.py`` in
``fedage-droid/FEDAGE-One-Shot-Federated-Learning`` (commit bf54189; the file is pinned by its
SHA-256, so the line numbers below are its own). This plugin parses that function and runs
chosen ranges of its statements, unedited and in file order, each range whole statements
(a range inside a loop is that loop's body, the loop's header being played by our driver):

* **Client** (each client on its own data, through the shared frozen encoder):
  :103-114 (their ``Classifier`` d → 128 → C, one per client, Adam at ``lr``, cross-entropy),
  :117-144 (their training loop: ``epochs`` epochs over the client's loader, the encoder run
  on every batch of every epoch), :161 and :165-166 (``temperature`` and their confidence),
  then :178-208, the body of their collection loop: the client's latents ``encoder(x)``
  with its head's logits, pseudo-labels and confidences (the DP branch :201-208 is off). The
  client uploads what FedAGE's message is — its latents and its head — the same fields and
  bytes as ``fedage``'s (its logits, pseudo-labels and confidences stay on the client; the
  pseudo-labels give ``pseudo_label_agreement``).
* **Server**, on the uploaded latents and heads: :147-175 (their ``ServerClassifier``, one
  Adam, β, γ, τ, the hard-coded 50 + 50 epochs, their loss), then for client i = 1 … n in id
  order the body of their loop :177, :178-208 (teacher logits, pseudo-labels, confidences
  from client i's head on its latents) and :210-253 (phase 1: 50 epochs on client i's block,
  the teacher mixed with the live server head), then :257-286 (phase 2: 50 epochs on all
  latents against the mean of the heads, confidence-weighted, plus CE on each latent's
  own-client pseudo-label, a fresh Adam at lr/2). The outcome is the encoder followed by their
  trained server head (as ``head_mlp``: the same layers), evaluated by the run like every
  method.
* **What their code prints** (``evaluate``, on by default): :289-325 on the test split —
  ``ServerModel`` (encoder + the final server head, :289-300), ``evaluate_model`` (percent
  correct, :303-318), each client head's test accuracy printed (:320-322) and the server's,
  ``Server Model Accuracy: {server_acc:.2f}%`` (:324-325); :344 saves the same ``server_acc``
  as the run's ``accuracy`` (written at :352-353). **It is the final model's accuracy**: no
  test evaluation happens during training (:144, :253, :286 print losses and the head's
  running *training* accuracy only), no epoch or model is selected, and the model scored is
  the one after the last ensemble epoch — the model the paper's method trains. Recorded as
  ``authors_printed_accuracy`` (the printed percentage / 100, same units as ``accuracy``),
  ``authors_saved_accuracy`` (the unrounded value of :344), and
  ``authors_printed_client_accuracies`` (:322), beside the run's own evaluation of the outcome
  (``accuracy``); the two differ by their 2-decimal rounding only.

Adaptations, all outside their code:

* **argparse**: their ``parse_args`` (:41-65) runs on an ``argv`` built from the config
  (``--epochs``, ``--batch_size``, ``--lr``, ``--beta``, ``--temperature`` = ``tau``,
  ``--mixture_coef`` = ``gamma``, ``--output_dim`` = the encoder's d, ``--num_clients`` = 1
  on a client and n on the server, ``--seed`` = the run's seed), ``sys.argv`` restored after.
  ``num_classes`` is the task's (theirs is read from the dataset name, :83-86).
* **Data**: their torchvision loaders and Dirichlet split (``datasets.py``, :89-94) are not
  run. A client's loader is its own data, batch ``batch_size``, shuffled from torch's global
  generator as their ``shuffle=True`` (``RandomSampler``, which also records the order so the
  pseudo-labels can be compared with the labels); no worker processes or pinned memory. On the
  server, client i's loader holds its uploaded latents (labels unused: ``for inputs, _``).
  The test loader is the dataset's test split (reloaded by name, as ``fedd3_authors``: the
  split the run evaluates on, unless a ``feature_skew`` or a ``data_root`` outside
  ``$ONESHOTFL_DATA`` changed it), batch ``batch_size``, in order.
* **Encoder**: theirs is an ImageNet ResNet-18 (``backbones.py``) behind ``gpu_transform``
  (:19-32: resize to 224, grey → 3 channels, ImageNet normalisation — that network's input
  pipeline). Here ``encoder`` is the federation's shared frozen encoder with its own
  preprocessing (``Encoder.embed``) and ``gpu_transform`` is the identity. On the server,
  which receives latents, not images, ``encoder`` is the identity in the collection lines;
  for their evaluation it is the shared encoder again, whose embeddings of a test batch are
  computed once for the n + 1 models scored (it is frozen: the same numbers).
* **CUDA**: ``device`` is the run's device (theirs: ``cuda`` when available, :79), and
  ``Tensor.cuda`` (:182, :296) moves to it while their lines run (restored after).
* **Global state**: their ``main`` seeds the global generators once (:73-77); here each party
  seeds torch's global CPU generator with its own stream of the run's seed (the client's id,
  or the server) inside a fork, restored after, so their head and server initialisations
  (PyTorch's default, whatever the federation's ``init``) and shuffles are reproducible.
  ``print`` is a collector whose lines are parsed for the printed accuracies; the results file
  (:327-353) is not written (its ``accuracy`` is ``server_acc``, recorded above).
* **The heads' class**: the uploaded head is their trained ``Classifier``'s weights in
  ``head_mlp`` (fc1 → ``features.1``, fc2 → ``head``: the same Linear → ReLU → Linear); the
  server calls the rebuilt ``head_mlp`` where their code calls ``clf(...)``.

Refused (their code hard-codes or lacks them): every reading knob other than the
``authors`` reading's values (50 + 50 epochs, one shared Adam, …), heads other than
``head_mlp``, ``schedule``/``order`` other than sequential in id order, a step floor (their
client trains exactly ``epochs`` epochs: ``steps`` must resolve to 0), and ``dp_epsilon`` /
``label_epsilon`` (their DP, ``dp_utils.add_dp_noise``, is not wired here).

Diagnostics besides the printed accuracies: ``authors_server_train_s`` (their server lines
:147-286) and ``authors_evaluation_s`` (:289-325; part of ``server_wall_s``, to subtract
when comparing times), ``authors_final_loss`` (their last printed ensemble-epoch loss).

Needs ``FEDAGE_REPO`` = a checkout of that repository.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import authors_digest, authors_file, authors_functions
from load import test_split as shared_test_split

from oneshotfl.encoders.base import EncodedClassifier
from oneshotfl.extend import (
    ClientContext,
    Encoder,
    GlobalModel,
    LabelledData,
    Outcome,
    Payload,
    ServerContext,
    TaskInfo,
    TrainConfig,
    WireDims,
    client_artefact,
    model_fields,
    register_method,
    require,
    seeded_torch,
)
from oneshotfl.methods.common import head_from_payload
from oneshotfl.methods.fedage import FedAGE
from oneshotfl.methods.fedage_config import READINGS, FedAGEConfig
from oneshotfl.privacy import latent_privacy_report

ENV = "FEDAGE_REPO"
FILE = "pipeline.py"
DIGEST = "e0c007fbcb2aec32938791324ecc54b976eecdf5a4f204c8c9988c8b442fd4f0"
"""SHA-256 of ``pipeline.py`` at bf54189: the line ranges below are this file's."""
CACHE_VERSION = 1

Lines = tuple[tuple[int, int], ...]
CLIENT_HEAD: Lines = ((103, 114), (117, 144))
"""Their client heads, optimisers and loss (:103-114), then the training loop (:117-144)."""
TEACHER: Lines = ((161, 161), (165, 166))
"""``temperature`` and ``compute_confidence_weights``, which the collection lines read."""
COLLECT: Lines = ((178, 208),)
"""The body of their collection loop (:177): a client's latents and its head's outputs."""
SERVER_SETUP: Lines = ((147, 175),)
SERVER_BLOCK: Lines = ((210, 253),)
"""The rest of the loop body: phase 1 on one client's block."""
ENSEMBLE: Lines = ((257, 286),)
EVALUATION: Lines = ((289, 325),)

THEIRS_TO_OURS = {
    "fc1.weight": "features.1.weight",
    "fc1.bias": "features.1.bias",
    "fc2.weight": "head.weight",
    "fc2.bias": "head.bias",
}
"""Their ``Classifier``/``ServerClassifier`` parameters by our ``head_mlp``'s names."""


def main_body() -> tuple[Path, list[ast.stmt]]:
    """``$FEDAGE_REPO/pipeline.py`` (checked against :data:`DIGEST`) and ``main()``'s body.

    Raises:
        ValueError: when the file is another version, or has no ``main``.
    """
    path = authors_file(ENV, FILE)
    text = path.read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if digest != DIGEST:
        raise ValueError(f"{path}: expected pipeline.py of bf54189 (sha256 {DIGEST}), got {digest}")
    tree = ast.parse(text, str(path))
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    if len(mains) != 1:
        raise ValueError(f"{path}: expected one function main, found {len(mains)}")
    return path, mains[0].body


def statements(body: Sequence[ast.stmt], first: int, last: int) -> list[ast.stmt]:
    """The statements of ``body`` spanning exactly lines ``first``–``last``; when one
    statement (a loop) holds the whole range, those of its body.

    Raises:
        ValueError: when the range does not start and end on whole statements.
    """
    inside = [n for n in body if first <= n.lineno and (n.end_lineno or n.lineno) <= last]
    across = [
        n
        for n in body
        if n not in inside and n.lineno <= last and (n.end_lineno or n.lineno) >= first
    ]
    if not inside and len(across) == 1:
        node = across[0]
        inner = [*getattr(node, "body", []), *getattr(node, "orelse", [])]
        return statements(inner, first, last)
    if across or not inside or inside[0].lineno != first or inside[-1].end_lineno != last:
        raise ValueError(f"{FILE}: lines {first}-{last} are not whole statements of main()")
    return inside


def run_lines(ranges: Lines, namespace: dict[str, Any]) -> None:
    """Their statements of ``main()`` in ``ranges``, unedited, executed in ``namespace``
    (their function's locals and globals in one)."""
    path, body = main_body()
    nodes = [node for first, last in ranges for node in statements(body, first, last)]
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)


def their_args(cfg: FedAGEConfig, dim: int, clients: int, seed: int) -> argparse.Namespace:
    """Their ``parse_args()`` on the command line of ``cfg`` (module docs)."""
    parse = authors_functions(ENV, FILE, ("parse_args",), {"argparse": argparse})["parse_args"]
    argv = ["pipeline.py", "--num_clients", str(clients), "--output_dim", str(dim)]
    argv += ["--epochs", str(cfg.epochs), "--batch_size", str(cfg.batch_size)]
    argv += ["--lr", repr(cfg.lr), "--beta", repr(cfg.beta), "--temperature", repr(cfg.tau)]
    argv += ["--mixture_coef", repr(cfg.gamma), "--seed", str(seed)]
    saved = sys.argv
    sys.argv = argv
    try:
        args: argparse.Namespace = parse()
    finally:
        sys.argv = saved
    return args


class Said:
    """Their ``print``: the lines, kept."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *values: object, sep: str = " ", **_: object) -> None:
        self.lines.append(sep.join(str(v) for v in values))

    def percents(self, pattern: str) -> list[float]:
        """Every ``pattern`` (one group: a number) in the lines, in print order."""
        return [float(m) for line in self.lines for m in re.findall(pattern, line)]


def unchanged(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """In place of their ``gpu_transform``: the encoder preprocesses its own inputs."""
    return x


class SharedEncoder(nn.Module):
    """Their ``encoder``: the shared frozen encoder (with its own preprocessing) on
    ``device``; with ``memo``, a batch seen before is not embedded again."""

    def __init__(self, encoder: Encoder, device: torch.device, memo: bool = False) -> None:
        super().__init__()
        self.frozen, self.device, self.memo = encoder, device, memo
        self.seen: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().cpu()
        if not self.memo:
            return self.frozen.embed(x, self.device).to(self.device)
        key = (tuple(x.shape), hashlib.sha1(x.numpy().tobytes()).hexdigest())
        if key not in self.seen:
            self.seen[key] = self.frozen.embed(x, self.device).to(self.device)
        return self.seen[key]


@contextlib.contextmanager
def cuda_is(device: torch.device) -> Iterator[None]:
    """``Tensor.cuda(...)`` moves to ``device`` inside the block (their :182 and :296)."""
    had = "cuda" in torch.Tensor.__dict__
    original = torch.Tensor.__dict__.get("cuda")

    def moved(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self.to(device)

    setattr(torch.Tensor, "cuda", moved)  # noqa: B010  (mypy refuses assigning a method)
    try:
        yield
    finally:
        if had:
            setattr(torch.Tensor, "cuda", original)  # noqa: B010
        else:
            delattr(torch.Tensor, "cuda")


class RecordedOrder(RandomSampler):
    """``shuffle=True``'s sampler (torch's global generator), remembering its last order."""

    def __init__(self, data: TensorDataset) -> None:
        super().__init__(data)
        self.last: list[int] = []

    def __iter__(self) -> Iterator[int]:
        self.last = list(super().__iter__())
        return iter(self.last)


def their_scope(
    args: argparse.Namespace, device: torch.device, classes: int, encoder: nn.Module, said: Said
) -> dict[str, Any]:
    """The names their lines read: their imports, their ``to_device`` (:34-35), and the
    locals ``main()`` sets before them (``args``, ``device``, ``num_classes``, ``encoder``)."""
    scope: dict[str, Any] = {"torch": torch, "nn": nn, "optim": optim, "F": F, "print": said}
    scope.update(DataLoader=DataLoader, TensorDataset=TensorDataset, gpu_transform=unchanged)
    scope.update(authors_functions(ENV, FILE, ("to_device",), {"torch": torch}))
    scope.update(args=args, device=device, num_classes=classes, encoder=encoder)
    return scope


def as_head_mlp(theirs: nn.Module, dims: WireDims) -> nn.Module:
    """Their trained ``Classifier`` (or ``ServerClassifier``) as our ``head_mlp``, on the CPU."""
    state = theirs.state_dict()
    arrays = {f"head.{THEIRS_TO_OURS[k]}": v.detach().cpu().numpy() for k, v in state.items()}
    return head_from_payload(Payload(arrays, {"head.arch": "head_mlp"}), dims)


@dataclass(frozen=True)
class ClientStep:
    """What their client lines leave: the head (``head_mlp``), the latents in their loader's
    last order, the pseudo-labels their collection computed, that order, the printed lines."""

    head: nn.Module
    latents: torch.Tensor
    logits: torch.Tensor
    pseudo: torch.Tensor
    order: torch.Tensor
    printed: Said


def authors_client_step(
    data: LabelledData,
    encoder: Encoder,
    dims: WireDims,
    cfg: FedAGEConfig,
    seed: int,
    client_id: int,
    device: torch.device,
) -> ClientStep:
    """Their client lines (:103-144, :161, :165-166, :178-208) on one client's data."""
    said = Said()
    args = their_args(cfg, encoder.dim, 1, seed)
    dataset = TensorDataset(data.x, data.y)
    sampler = RecordedOrder(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    ns = their_scope(args, device, dims.num_classes, SharedEncoder(encoder, device), said)
    ns["client_loaders"] = [loader]
    with seeded_torch(seed, "fedage_authors", "client", client_id), cuda_is(device):
        run_lines(CLIENT_HEAD, ns)
        ns.update(client_id=1, loader=loader)  # :177's header, for a federation of one
        run_lines(TEACHER + COLLECT, ns)
    return ClientStep(
        head=as_head_mlp(ns["clf"], dims),
        latents=ns["client_latents"].detach().cpu(),
        logits=ns["client_logits"].detach().cpu(),
        pseudo=ns["client_pseudos"].detach().cpu(),
        order=torch.as_tensor(sampler.last, dtype=torch.int64),
        printed=said,
    )


@dataclass(frozen=True)
class ServerStep:
    """Their server's trained head (``head_mlp``), its state before training, the printed
    lines, ``server_acc`` (percent, or None without the evaluation) and the seconds spent."""

    head: nn.Module
    initial: nn.Module
    printed: Said
    server_acc: float | None
    final_loss: float
    train_s: float
    evaluation_s: float


def authors_server_step(
    latents: Sequence[torch.Tensor],
    heads: Sequence[nn.Module],
    dims: WireDims,
    cfg: FedAGEConfig,
    seed: int,
    device: torch.device,
    test: tuple[LabelledData, Encoder] | None,
) -> ServerStep:
    """Their server lines (:147-175, then per client :178-208 and :210-253, then :257-286) on
    the uploaded latents and heads (in client order), and with ``test`` their evaluation
    (:289-325) of the final model on it."""
    said = Said()
    args = their_args(cfg, dims.extra["D"], len(latents), seed)
    ns = their_scope(args, device, dims.num_classes, nn.Identity(), said)
    ns["client_classifiers"] = [h.to(device).eval() for h in heads]
    start = time.perf_counter()
    with seeded_torch(seed, "fedage_authors", "server"), cuda_is(device):
        run_lines(SERVER_SETUP, ns)
        initial = as_head_mlp(ns["server_classifier"], dims)
        for i, z in enumerate(latents, start=1):  # :177's header over the uploads
            unlabelled = TensorDataset(z, torch.zeros(len(z), dtype=torch.int64))
            loader = DataLoader(unlabelled, batch_size=args.batch_size, shuffle=True)
            ns.update(client_id=i, loader=loader)
            run_lines(COLLECT + SERVER_BLOCK, ns)
        run_lines(ENSEMBLE, ns)
        train_s = time.perf_counter() - start
        final_loss = float(ns["total_loss"] / len(ns["train_loader"]))
        start, server_acc = time.perf_counter(), None
        if test is not None:
            data, encoder = test
            tests = TensorDataset(data.x, data.y)
            ns["test_loader"] = DataLoader(tests, batch_size=args.batch_size, shuffle=False)
            ns["encoder"] = SharedEncoder(encoder, device, memo=True)
            run_lines(EVALUATION, ns)
            server_acc = float(ns["server_acc"])
    return ServerStep(
        head=as_head_mlp(ns["server_classifier"], dims),
        initial=initial,
        printed=said,
        server_acc=server_acc,
        final_loss=final_loss,
        train_s=train_s,
        evaluation_s=time.perf_counter() - start,
    )


def test_split(task: TaskInfo) -> LabelledData:
    """The dataset's test split, loaded once per process (see the module docs)."""
    split: LabelledData = shared_test_split(task, "fedage_authors")
    return split


@dataclass(frozen=True)
class FedAGEAuthorsConfig(FedAGEConfig):
    """``fedage``'s, restricted to what their ``pipeline.py`` runs (module docs).

    Attributes:
        evaluate: run their evaluation (:289-325) on the test split for the accuracy their
            code prints (its seconds are in ``authors_evaluation_s``).
    """

    evaluate: bool = True

    def validate(self) -> None:
        super().validate()
        require(self.reading == "authors", "reading", "authors (their pipeline.py)", self.reading)
        for knob, value in READINGS["authors"].items():
            mine = getattr(self, knob)
            why = f"None or {value!r} (hard-coded in the authors' pipeline.py)"
            require(mine is None or mine == value, knob, why, mine)
        for name in ("head", "server_head"):
            why = "head_mlp (their Classifier, d → 128 → C)"
            require(getattr(self, name) == "head_mlp", name, why, getattr(self, name))
        why = "sequential (their loop :177)"
        require(self.schedule == "sequential", "schedule", why, self.schedule)
        require(self.order == "id", "order", "id (their loop :177)", self.order)
        why = "None or 0 (their client trains exactly `epochs` epochs, :120)"
        require(self.steps in (None, 0), "steps", why, self.steps)
        for name in ("dp_epsilon", "label_epsilon"):
            why = "None (the authors' DP is not wired in this plugin)"
            require(getattr(self, name) is None, name, why, getattr(self, name))


@register_method(
    "fedage_authors", "FedAGE, the authors' client and server steps (pipeline.py, plugin)"
)
class FedAGEAuthors(FedAGE):
    """``fedage``'s message (latents + a head); the authors' lines compute and distil it."""

    Config = FedAGEAuthorsConfig
    config: FedAGEAuthorsConfig

    def setting_problems(self, client_train: TrainConfig) -> list[str]:
        if self.config.steps is None and client_train.min_steps > 0:
            return [
                f"the authors' client trains exactly epochs={self.config.epochs} epochs "
                f"(pipeline.py:120), got a step floor local_steps={client_train.min_steps}: "
                "set local_steps 0 or steps=0"
            ]
        return []

    def _step(self, ctx: ClientContext) -> Payload:
        """Their client lines on ``ctx`` (cached): latents, head, pseudo-labels, order."""
        encoder = ctx.encoder
        if encoder is None:
            raise ValueError("fedage_authors needs the shared frozen encoder: set encoder")
        cfg = self.config

        def make() -> Payload:
            step = authors_client_step(
                ctx.data, encoder, ctx.dims, cfg, ctx.seed, ctx.client_id, ctx.device
            )
            trained = step.printed.percents(r"Acc: ([0-9.]+)%")  # :144, every epoch
            arrays: dict[str, np.ndarray] = {
                "latents": step.latents.numpy().astype(np.float32),
                "pseudo": step.pseudo.numpy().astype(np.int64),
                "order": step.order.numpy(),
            }
            printed = trained[-1] / 100 if trained else math.nan
            return Payload(arrays, {"printed_train_accuracy": printed}).merged(
                model_fields(step.head, "head")
            )

        parts = {
            "version": CACHE_VERSION,
            "authors": authors_digest(ENV, (FILE,)),
            "encoder": encoder.fingerprint,
            "args": [cfg.epochs, cfg.batch_size, cfg.lr, cfg.tau],
            "device": ctx.device.type,
        }
        return client_artefact(ctx, "fedage_authors_client", parts, make, "fedage_authors step")

    def client_update(self, ctx: ClientContext) -> Payload:
        step = self._step(ctx)
        latents = np.asarray(step.arrays["latents"])
        heads = {k: v for k, v in step.arrays.items() if k.startswith("head.")}
        scalars = {"n_examples": len(latents), "head.arch": step.scalars["head.arch"]}
        return Payload({"latents": latents, **heads}, scalars)

    def local_model(self, ctx: ClientContext) -> nn.Module:
        """The client's head (theirs) on the shared encoder."""
        if ctx.encoder is None:
            raise ValueError("fedage_authors needs the shared frozen encoder: set encoder")
        return EncodedClassifier(ctx.encoder, head_from_payload(self._step(ctx), ctx.dims))

    def client_facts(self, ctx: ClientContext) -> dict[str, float]:
        """``pseudo_label_agreement`` (as ``fedage``'s: their pseudo-labels of the uploaded
        latents against the true labels, in their loader's order) and
        ``authors_printed_train_accuracy`` (their last epoch's running training accuracy,
        :143-144)."""
        step = self._step(ctx)
        order = torch.from_numpy(np.asarray(step.arrays["order"]))
        pseudo = torch.from_numpy(np.asarray(step.arrays["pseudo"]))
        agreement = float((pseudo == ctx.data.y[order]).double().mean())
        trained = float(step.scalars["printed_train_accuracy"])
        return {"pseudo_label_agreement": agreement, "authors_printed_train_accuracy": trained}

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        encoder = ctx.encoder
        if encoder is None:
            raise ValueError("fedage_authors needs the shared frozen encoder: set encoder")
        cfg, ids = self.config, sorted(payloads)
        latents = [torch.from_numpy(np.asarray(payloads[c].arrays["latents"])) for c in ids]
        heads = [head_from_payload(payloads[c], ctx.dims) for c in ids]
        test = (test_split(ctx.task), encoder) if cfg.evaluate else None
        step = authors_server_step(latents, heads, ctx.dims, cfg, ctx.seed, ctx.device, test)
        info: dict[str, Any] = {
            "order": ids,
            "latents": sum(len(z) for z in latents),
            "privacy": latent_privacy_report(cfg),
            "authors_server_train_s": step.train_s,
            "authors_evaluation_s": step.evaluation_s,
            "authors_final_loss": step.final_loss,
        }
        if step.server_acc is not None:
            printed = step.printed.percents(r"Server Model Accuracy: ([0-9.]+)%")
            clients = step.printed.percents(r"Client \d+ Accuracy: ([0-9.]+)%")
            info["authors_printed_accuracy"] = printed[-1] / 100
            info["authors_saved_accuracy"] = step.server_acc / 100
            info["authors_printed_client_accuracies"] = [a / 100 for a in clients]
        return GlobalModel(EncodedClassifier(encoder, step.head.cpu().eval()).eval(), info)

    def notes(self, diagnostics: Mapping[str, Any]) -> list[str]:
        printed = diagnostics.get("authors_printed_accuracy")
        if printed is None:
            return []
        return [
            f"the authors' code prints {100 * printed:.2f}% (pipeline.py:325): the final "
            "server model's test accuracy, no epoch selected; `accuracy` is ours of the same model"
        ]
