"""Plugins ``fedeov_authors`` and ``fedov_authors``: FedEOV and FedOV with the authors' negatives
and vote, unedited.

Clients are ``fedeov``'s and ``fedov``'s (the same recipe, curriculum, optimiser, batches and
random streams: the recipe keeps its name, so the shuffles and the initial model are ours), with
one change: the negatives appended to every batch come from the code of
``AnonSubmitter135/FedEOV`` (commit 7e5119a), through the component ``negatives_authors``:

* the corruptions: the seven-way ``transforms.RandomChoice`` that their client step builds
  (the statements ``aug_crop`` and ``aug_final`` of ``local_train_eov`` for ``fedeov``, of
  ``local_train_fedov`` for ``fedov``, in ``federated_algorithms.py``; they are the same list),
  with their ``blur``, ``cut`` and ``rot`` (``methods.py``) and torchvision's
  ``RandomResizedCrop`` and ``RandomErasing``, applied one image at a time on the CPU, as their
  loop applies it;
* the jigsaw: their ``generate_shuffled_tensors`` over a permutation file made by their
  ``generate_permutations`` (``utils.py``), then, with ``smooth``, their
  ``smooth_patch_edges`` (a kernel-5 blur of each 5-pixel seam band);
* the attack: their ``FastGradientSignTargeted`` (FedEOV) or ``FastGradientSignUntargeted``
  (FedOV) of ``methods.py`` (with ``project``), ε = ``fgsm_epsilon``, step α = ``fgsm_step``,
  ``fgsm_steps`` iterations, towards the "unknown" label; both raise its loss, as ours does.

Which negatives a batch gets (the stages ⌊8e/E⌋, warm-up then full FGSM, jigsaw from stage 3,
the clean copies kept by FedOV) is our curriculum, which reads theirs (``oneshotfl describe
fedeov``): the FGSM budget is the same knob on both sides. The server keeps every model and
combines them with their ``ensemble_inference`` (``methods.py``): ``vote=voting`` (default)
is the rule their ``compute_ensemble_accuracy`` runs, the sum of the known-class
probabilities of the ``accepted_votes`` members least sure of "unknown", normalised;
``vote=weighted`` is their other rule (members weighted by a softmax over members of 1 − p⊥);
``vote=ours`` keeps our combiner. ``negatives=ours`` keeps our negatives, so the two steps
can be told apart: ``negatives=ours`` has ``fedeov``'s clients (a cache hit) and only
their vote.

Adaptations, all outside their code:

* Their models put "unknown" at output 0 (labels shifted by one); ours at output C. The vote
  receives each member's logits with the last column moved first. The attack takes the
  label C on our models (cross-entropy does not depend on the order of the outputs).
* Their randomness is global (Python's ``random``, torch's CPU generator, NumPy for the
  permutation file). Each batch draws one seed from the component's own stream; Python's,
  NumPy's and torch's CPU generators are seeded with it for the call and restored after, so a
  run is reproducible and the rest of the run's randomness is untouched. (Clients trained
  concurrently in threads of one process would share these generators.)
* Their permutation file is ``./permutations.pt``, rewritten by every run of their ``main``
  (1000 random non-identity permutations, from NumPy's generator seeded by ``--init_seed``).
  Each jigsaw component writes its own file with their ``generate_permutations`` into a
  temporary folder, NumPy seeded from the component's stream (restored after), its printing
  silenced; their ``generate_shuffled_tensors`` reads it back on every batch, as theirs does.
* Their attack runs in whatever mode the model is in: with ``bn=code`` (``fedeov``'s
  default, and what their FedOV and FedEOV do) the training mode; with ``bn=eval``
  (``fedov``'s default, FedOV's own repository) the plugin switches the model to eval mode
  around the call. Their attack moves the tensor it is given in place in its first step; it
  is given a copy, so the clean negatives FedOV keeps stay clean. Its output is detached.
* Their attack classes only raise the loss of their target: ``fgsm=toward_source`` is
  refused. The FedEOV repository has one corruption list for FedOV and FedEOV, so ``style``
  (FedOV's own repository's corruptions in ``fedov``) only picks which of their two functions
  the list and the attack class are read from. Their jigsaw needs an image side divisible by
  ``grid`` (ours leaves a remainder border): anything else is refused.
* Units: their images are normalised to [-1, 1]; ours by the dataset's mean and standard
  deviation. Their functions are applied to our tensors as they are, so ``RandomErasing``
  writes 0 (our mean; their mid-grey) and a step α is in our units.
* A saved or relayed outcome records the rule ``abstention:K`` and replays our combiner,
  which agrees with theirs except on ties of p⊥ (their ``argsort`` is not stable; ours keeps
  the lower member) and on rows whose accepted members all have p⊥ = 1 (theirs divides by
  zero; ours gives the uniform row).
* A disk cache keys the clients by the component's name and parameters, not by the checkout:
  use a fresh cache (or none, ``cache_dir: ""``) when ``FEDEOV_REPO`` changes.

Where theirs and ours differ (``tests/test_authors_fedeov.py`` measures each): given the same
draws, their ``rot``, their blur, their jigsaw without seams and their attack (float64) give
exactly what ours give, and their ``voting`` rule is our top-k vote. Their ``cut`` assigns
between overlapping column slices of one tensor; when the target strip lies right of the
source, torch (2.14 on the CPU here; their pinned 2.2.1 not checked) may copy column by column
and the image repeats a period of target − source columns instead of holding the strip: on
28-pixel images it does for every such draw (44% of their cuts, so about 13% of their
corrupted negatives), on 32-pixel images for none. Their seam smoothing blurs each 5-pixel
band alone with its own σ; ours blurs the image once (the same bands change). Their crop and
erasing are torchvision's (bilinear resize with antialiasing, rejection sampling of the
rectangle); ours are a ``grid_sample`` crop and a clamped rectangle. Their per-image loop and
seam loop are slower: on one thread, a batch of 128 Fashion-MNIST images costs 42 ms of
their corruptions against 18 ms of ours, 575 against 38 ms with the jigsaw, and 1.46 s
against 0.94 s with the three-step attack as well.

What their code prints, and what this reports: their ``main`` prints the accuracy that
``compute_ensemble_accuracy`` returns ("Overall Ensemble Model Accuracy", ``methods.py``):
the top-5 vote of the clients' models after their last epoch, over the union of the
per-client test shards, which under their ``XtremeHetero`` (and Dirichlet) partition is the
whole official test split once. No epoch and no k is chosen on the test set there (the test
loader handed to ``local_train_fedov`` is never read). The accuracy reported here is the
same quantity on our test split: the final models, no selection.

Needs ``FEDEOV_REPO`` = a checkout of that repository (torchvision installed).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import io
import itertools
import math
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision import transforms
from torchvision.transforms import GaussianBlur

from oneshotfl.encoders.cost import inference_latency_ms
from oneshotfl.extend import (
    ClientContext,
    ClientRecipe,
    Component,
    ComponentEnv,
    Ensemble,
    Outcome,
    Payload,
    ServerContext,
    register_component,
    register_method,
    require,
)
from oneshotfl.methods.fedeov import LATENCY_BATCH, FedEOV, FedEOVConfig
from oneshotfl.methods.fedov import FedOV, FedOVConfig
from oneshotfl.training.components import require_unknown_output
from oneshotfl.training.negatives import NegativesConfig

ENV = "FEDEOV_REPO"
COMPONENT = "negatives_authors"
METHODS_FILE = "methods.py"
UTILS_FILE = "utils.py"
CLIENT_FILE = "federated_algorithms.py"
CLIENT_STEP = {"fedeov": "local_train_eov", "fedov": "local_train_fedov"}
"""Whose corruption list (``style``): the client step of their FedEOV, of their FedOV."""
ATTACK = {"fedeov": "FastGradientSignTargeted", "fedov": "FastGradientSignUntargeted"}
"""Whose attack class (``style``): their FedEOV's, their FedOV's."""
METHODS_NAMES = (
    "cut",
    "rot",
    "blur",
    "project",
    "FastGradientSignUntargeted",
    "FastGradientSignTargeted",
    "ensemble_inference",
)
UTILS_NAMES = ("generate_permutations", "generate_shuffled_tensors", "smooth_patch_edges")
AUGMENTATION = ("aug_crop", "aug_final")
SEAM_KERNEL = 5
"""The blur kernel their client step passes to ``smooth_patch_edges``."""


def checkout() -> Path:
    """``$FEDEOV_REPO``, which must name a folder."""
    root = os.environ.get(ENV)
    if not root or not Path(root).is_dir():
        raise ValueError(f"expected {ENV} naming a checkout of the authors' code, got {root!r}")
    return Path(root)


def _parsed(root: Path, file: str) -> ast.Module:
    path = root / file
    if not path.is_file():
        raise ValueError(f"expected the authors' file at {path}, got nothing")
    return ast.parse(path.read_text(), str(path))


def _run(
    root: Path, file: str, body: Sequence[ast.stmt], names: Sequence[str], scope: dict[str, Any]
) -> dict[str, Any]:
    namespace = dict(scope)
    code = compile(ast.Module(body=list(body), type_ignores=[]), str(root / file), "exec")
    exec(code, namespace)
    return {name: namespace[name] for name in names}


def top_level(root: Path, file: str, names: Sequence[str], scope: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions and classes ``names`` of ``root/file``, their source executed
    alone in ``scope`` (what ``load.authors_definitions`` does, from a given folder)."""
    tree = _parsed(root, file)
    body = [
        n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names
    ]
    found = sorted(n.name for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef))
    if found != sorted(names):
        raise ValueError(f"{root / file}: expected one each of {sorted(names)}, found {found}")
    return _run(root, file, body, names, scope)


def statements_of(
    root: Path, file: str, function: str, names: Sequence[str], scope: dict[str, Any]
) -> dict[str, Any]:
    """The assignments ``NAME = …`` to ``names`` in the body of the top-level function
    ``function`` of ``root/file``, executed alone, in file order, in ``scope`` (what the
    function's other statements would have put there)."""
    tree = _parsed(root, file)
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    if len(funcs) != 1:
        raise ValueError(f"{root / file}: expected one function {function}, found {len(funcs)}")
    body = [
        s
        for s in funcs[0].body
        if isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and s.targets[0].id in names
    ]
    found = sorted(s.targets[0].id for s in body if isinstance(s.targets[0], ast.Name))
    if found != sorted(names):
        raise ValueError(
            f"{root / file}: expected one each of {sorted(names)} in {function}, found {found}"
        )
    return _run(root, file, body, names, scope)


@dataclass(frozen=True)
class AuthorsCode:
    """What the plugins run of the checkout at ``root``."""

    root: Path
    methods: Mapping[str, Any]
    utils: Mapping[str, Any]

    def augmentation(self, style: str, side: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Their ``aug_final`` of the client step of ``style``, for images of ``side``."""
        return _augmentation(self.root, style, side)


@functools.cache
def _code(root: Path) -> AuthorsCode:
    methods_scope = {"torch": torch, "F": F, "random": random, "transforms": transforms}
    methods = top_level(root, METHODS_FILE, METHODS_NAMES, methods_scope)
    utils_scope = {
        "math": math,
        "itertools": itertools,
        "np": np,
        "torch": torch,
        "GaussianBlur": GaussianBlur,
    }
    utils = top_level(root, UTILS_FILE, UTILS_NAMES, utils_scope)
    return AuthorsCode(root, methods, utils)


@functools.cache
def _augmentation(root: Path, style: str, side: int) -> Callable[[torch.Tensor], torch.Tensor]:
    methods = _code(root).methods
    scope = {"transforms": transforms, "sz": side} | {k: methods[k] for k in ("blur", "cut", "rot")}
    built = statements_of(root, CLIENT_FILE, CLIENT_STEP[style], AUGMENTATION, scope)
    aug: Callable[[torch.Tensor], torch.Tensor] = built["aug_final"]
    return aug


def authors_code() -> AuthorsCode:
    """The authors' functions of ``$FEDEOV_REPO``, loaded once per checkout."""
    return _code(checkout().resolve())


def draw_seed(generator: torch.Generator) -> int:
    """A 62-bit seed from ``generator``."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


@contextlib.contextmanager
def global_generators(seed: int) -> Iterator[None]:
    """Python's, NumPy's and torch's CPU global generators seeded with ``seed`` for the
    block, and restored after it."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.random.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(cpu)


@dataclass(frozen=True)
class AuthorsNegativesConfig(NegativesConfig):
    """``negatives``'s parameters (:class:`NegativesConfig`); ``fgsm`` only ``away_unknown``,
    the one direction their attack classes take."""

    def validate(self) -> None:
        super().validate()
        require(
            self.fgsm == "away_unknown",
            "fgsm",
            "away_unknown (the authors' attacks raise the loss of their target)",
            self.fgsm,
        )


def authors_negatives(
    model: nn.Module,
    x: torch.Tensor,
    cfg: NegativesConfig,
    unknown: int,
    seed: int,
    permutations: Path | None,
) -> torch.Tensor:
    """The negatives of one batch by the authors' code (see the module docs):
    ``[jigsaw(x); corrupt(x)]`` (those switched on), then their attack when ``fgsm_steps``
    (``[clean; attacked]`` with ``keep_clean``)."""
    code = authors_code()
    parts: list[torch.Tensor] = []
    with global_generators(seed):
        if cfg.corrupt:  # their loop: every image on the CPU through aug_final
            aug = code.augmentation(cfg.style, x.shape[-1])
            cpu = x.detach().cpu().clone()
            parts.append(torch.stack([aug(img) for img in cpu]).to(x.device, x.dtype))
        if cfg.jigsaw:
            h, w = x.shape[-2:]
            require(
                h % cfg.grid == 0 and w % cfg.grid == 0,
                "grid",
                f"a divisor of the image sides {h}×{w} (the authors' jigsaw)",
                cfg.grid,
            )
            assert permutations is not None
            shuffle = code.utils["generate_shuffled_tensors"]
            shuffled, _ = shuffle(x.detach(), grid_size=cfg.grid, path=str(permutations))
            if cfg.smooth:
                smooth = code.utils["smooth_patch_edges"]
                shuffled = smooth(shuffled, grid_size=cfg.grid, blur_kernel_size=SEAM_KERNEL)
            parts.insert(0, shuffled.detach())
    neg = torch.cat(parts).detach()
    if cfg.fgsm_steps == 0:
        return neg
    attack = code.methods[ATTACK[cfg.style]](
        model,
        epsilon=cfg.fgsm_epsilon,
        alpha=cfg.fgsm_step,
        min_val=0,
        max_val=1,
        max_iters=cfg.fgsm_steps,
        device=x.device,
    )
    target = torch.full((len(neg),), unknown, dtype=torch.long, device=x.device)
    was_training = model.training
    if cfg.bn == "eval":
        model.eval()
    try:
        adv = attack.perturb(neg.clone(), target).detach()
    finally:
        model.train(was_training)
    return torch.cat([neg, adv]) if cfg.keep_clean else adv


@register_component(COMPONENT, "open-set negatives by the FedEOV authors' code (plugin)")
class AuthorsNegatives(Component):
    """``negatives`` with the authors' corruptions, jigsaw and attack (see the module docs)."""

    Config = AuthorsNegativesConfig
    config: AuthorsNegativesConfig

    def __init__(self, config: AuthorsNegativesConfig, env: ComponentEnv) -> None:
        super().__init__(config, env)
        self.permutations: Path | None = None
        self.folder: tempfile.TemporaryDirectory[str] | None = None

    def setup(self, model: nn.Module) -> None:
        require_unknown_output(COMPONENT, "unknown", self.env)
        if not self.config.jigsaw:
            return
        self.folder = tempfile.TemporaryDirectory(prefix="fedeov-authors-")
        self.permutations = Path(self.folder.name) / "permutations.pt"
        make = authors_code().utils["generate_permutations"]
        with (
            global_generators(draw_seed(self.env.generator)),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            make(grid_size=self.config.grid, save_path=str(self.permutations))

    def extra_examples(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.bn == "code" and model.training:
            with torch.no_grad():
                model(x)  # the training loop's real-only forward in training mode (ours)
        unknown = self.env.num_classes
        seed = draw_seed(self.env.generator)
        neg = authors_negatives(model, x, self.config, unknown, seed, self.permutations)
        return neg, torch.full((len(neg),), unknown, dtype=y.dtype, device=y.device)


def _given(logits: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return logits


@dataclass(frozen=True)
class AuthorsVote:
    """The authors' ``ensemble_inference`` as an ensemble combiner: member logits
    ``[M, N, C+1]`` with "unknown" last → ``[N, C]`` probabilities. ``votes`` None: every
    member votes."""

    votes: int | None
    rule: Literal["voting", "weighted"] = "voting"

    def __call__(self, logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        first = torch.cat([logits[..., -1:], logits[..., :-1]], dim=-1)  # "unknown" at 0
        members = [functools.partial(_given, member) for member in first]
        votes = len(members) if self.votes is None else self.votes
        infer = authors_code().methods["ensemble_inference"]
        with torch.no_grad():
            out: torch.Tensor = infer(
                first[0], members, aggregation_method=self.rule, accepted_vote=votes
            )
        return out.float().cpu()


Negatives = Literal["authors", "ours"]
Vote = Literal["voting", "weighted", "ours"]


def check_authors_knobs(negatives: str, fgsm: str) -> None:
    require(
        negatives == "ours" or fgsm == "away_unknown",
        "fgsm",
        "away_unknown with negatives=authors (their attacks raise the loss of their target)",
        fgsm,
    )


def authors_recipe(recipe: ClientRecipe, negatives: str) -> ClientRecipe:
    """``recipe`` with its ``negatives`` component by the authors' code (``negatives=authors``)."""
    if negatives == "ours":
        return recipe
    specs = tuple(
        dataclasses.replace(s, name=COMPONENT) if s.name == "negatives" else s
        for s in recipe.components
    )
    return dataclasses.replace(recipe, components=specs)


def authors_outcome(outcome: Outcome, ctx: ServerContext, votes: int | None, vote: str) -> Outcome:
    """Our ensemble with the authors' vote as its combiner (``vote`` not ``ours``), its CPU
    latency measured again."""
    if vote == "ours" or not isinstance(outcome, Ensemble):
        return outcome
    outcome.combine = AuthorsVote(votes, "weighted" if vote == "weighted" else "voting")
    probe = torch.zeros(
        LATENCY_BATCH, ctx.task.in_channels, ctx.task.image_size, ctx.task.image_size
    )
    latency = inference_latency_ms(lambda x: outcome.predict_proba(x, torch.device("cpu")), probe)
    outcome.info |= {
        "combiner": f"authors' ensemble_inference ({vote})",
        "timings": {"latency_ms_per_image_cpu": latency},
    }
    return outcome


@dataclass(frozen=True)
class FedEOVAuthorsConfig(FedEOVConfig):
    """``fedeov``'s knobs, plus whose steps run.

    Attributes:
        negatives: ``authors`` (their corruptions, jigsaw and attack) or ``ours``.
        vote: their ``ensemble_inference`` rule, ``voting`` (their pipeline's) or
            ``weighted``; or ``ours`` (:func:`oneshotfl.functional.abstention_weighted_ensemble`).
    """

    negatives: Negatives = "authors"
    vote: Vote = "voting"

    def validate(self) -> None:
        super().validate()
        check_authors_knobs(self.negatives, self.fgsm)


@register_method("fedeov_authors", "FedEOV with the authors' negatives and vote (plugin)")
class FedEOVAuthors(FedEOV):
    """``fedeov``'s clients with the authors' negatives; their vote on the server."""

    Config = FedEOVAuthorsConfig
    config: FedEOVAuthorsConfig

    def recipe(self, ctx: ClientContext) -> ClientRecipe:
        return authors_recipe(super().recipe(ctx), self.config.negatives)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        outcome = super().aggregate(payloads, ctx)
        return authors_outcome(outcome, ctx, self.config.accepted_votes, self.config.vote)


@dataclass(frozen=True)
class FedOVAuthorsConfig(FedOVConfig):
    """``fedov``'s knobs, plus whose steps run (as :class:`FedEOVAuthorsConfig`)."""

    negatives: Negatives = "authors"
    vote: Vote = "voting"


@register_method("fedov_authors", "FedOV with the FedEOV authors' outliers and vote (plugin)")
class FedOVAuthors(FedOV):
    """``fedov``'s clients with the authors' outliers; their vote on the server."""

    Config = FedOVAuthorsConfig
    config: FedOVAuthorsConfig

    def recipe(self, ctx: ClientContext) -> ClientRecipe:
        return authors_recipe(super().recipe(ctx), self.config.negatives)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        outcome = super().aggregate(payloads, ctx)
        return authors_outcome(outcome, ctx, self.config.accepted_votes, self.config.vote)
