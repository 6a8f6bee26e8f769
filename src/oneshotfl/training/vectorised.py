"""Many clients' plain recipes trained together: stacked parameters, one ``vmap``'d step.

Where a federation has hundreds or thousands of clients holding a few dozen examples each, one
client's step is a few small matrix products and the sequential loop spends its time in
Python, autograd and optimiser bookkeeping, once per client. Here the ``G`` clients of a
*chunk* (``client_batch``) that share an architecture and training settings keep their
parameters stacked along a leading client axis; one step computes every client's gradient at
once with :func:`torch.func.vmap` over :func:`torch.func.grad` of
:func:`torch.func.functional_call`, and a functional SGD or Adam updates the stacked
parameters and optimiser state.

What each client computes is the sequential loop's (:func:`oneshotfl.training.loop.fit`),
step for step:

* the same initial model (the recipe's shared initialisation);
* the same batches: each client draws its epochs' shuffles from its own stream
  ``("client", id, "train", name)`` with :func:`~oneshotfl.training.loop.batch_indices`, so
  the example indices of its ``t``-th step are the sequential loop's;
* the same loss — the mean cross-entropy over the client's own batch. Batches of different
  sizes (shards smaller than a batch, a trailing batch) are padded to the chunk's largest and
  masked: a padded row weighs zero, and the mean divides by the client's real batch size;
* the same optimiser: ``torch.optim.SGD`` (momentum, weight decay) and ``torch.optim.Adam``
  (bias correction by the client's own step count) written as pure functions over stacked
  state, with ``grad_clip`` per client (``clip_grad_norm_``'s rule);
* the same budget: each client trains its own epochs (its step floor resolved over its own
  shard); a client that has finished is masked out of the remaining steps of its chunk and
  its parameters and state no longer move.

Only the floating-point order differs (a batched convolution sums in another order than a
single one), so the models are equal in distribution, not bit-identical, to the sequential
loop's; ``client_batch=1`` never comes here. What cannot be stacked trains sequentially:
a recipe with components or pruning, and a model with buffers that training changes
(BatchNorm's running statistics, whose batch statistics padding would also change) —
:func:`stackable` says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from oneshotfl.data.types import LabelledData, TaskInfo
from oneshotfl.seeding import torch_generator
from oneshotfl.training.loop import TrainConfig, batch_indices, steps_per_epoch
from oneshotfl.training.progress import NullTracker, Tracker
from oneshotfl.training.recipe import ClientRecipe, initial_model

Stacked = dict[str, torch.Tensor]


def stackable(recipe: ClientRecipe, model: nn.Module) -> str | None:
    """Why ``recipe`` on ``model`` cannot be trained stacked (``None``: it can)."""
    if recipe.components:
        return "its recipe adds components to cross-entropy"
    if recipe.pruning is not None:
        return "its recipe prunes"
    if any(True for _ in model.buffers()):
        return f"{type(model).__name__} has buffers that training updates (BatchNorm)"
    return None


@dataclass(frozen=True)
class Job:
    """One client's plain recipe to train: its id, recipe (epochs resolved) and data."""

    client_id: int
    recipe: ClientRecipe
    data: LabelledData


@dataclass(frozen=True)
class Trained:
    """One client's model trained in a chunk (CPU, eval mode), its steps, and its share of
    the chunk's seconds (the chunk's wall time split by the client's steps)."""

    model: nn.Module
    steps: int
    seconds: float


def group_key(recipe: ClientRecipe) -> tuple[object, ...]:
    """Jobs that may share a chunk: same architecture, outputs and settings but epochs."""
    train = recipe.train
    settings = (train.batch_size, train.lr, train.optimizer, train.momentum, train.weight_decay)
    return (recipe.arch, recipe.extra_outputs, recipe.name, *settings, train.init, train.grad_clip)


def chunks(jobs: Sequence[Job], size: int) -> Iterator[list[Job]]:
    """``jobs`` in chunks of at most ``size`` that share a :func:`group_key`, ordered by their
    step count and shard size so that a chunk's members finish together and pad little."""
    groups: dict[tuple[object, ...], list[Job]] = {}
    for job in jobs:
        groups.setdefault(group_key(job.recipe), []).append(job)
    for members in groups.values():
        members.sort(key=lambda j: (_total_steps(j), len(j.data), j.client_id))
        for i in range(0, len(members), size):
            yield members[i : i + size]


def _total_steps(job: Job) -> int:
    return job.recipe.epochs() * steps_per_epoch(len(job.data), job.recipe.train.batch_size)


class _Schedule:
    """One client's batches, epoch after epoch, drawn as :func:`fit` draws them."""

    def __init__(self, job: Job, seed: int) -> None:
        self.n = len(job.data)
        self.batch = job.recipe.train.batch_size
        self.epochs = job.recipe.epochs()
        self.total = _total_steps(job)
        self.generator = torch_generator(seed, "client", job.client_id, "train", job.recipe.name)
        self.pending: list[torch.Tensor] = []
        self.epoch = 0

    def next(self) -> torch.Tensor | None:
        """The next batch's indices into the client's data (``None``: done)."""
        if not self.pending:
            if self.epoch >= self.epochs or self.n == 0:
                return None
            self.epoch += 1
            self.pending = batch_indices(self.n, self.batch, self.generator)[::-1]
        return self.pending.pop()


def stacked_sgd(cfg: TrainConfig) -> Callable[[Stacked, Stacked, Stacked, torch.Tensor], None]:
    """``torch.optim.SGD``'s update (momentum, dampening 0, L2 weight decay) on stacked
    parameters, in place; ``active`` ``[G]`` says which clients step."""

    def step(params: Stacked, grads: Stacked, state: Stacked, active: torch.Tensor) -> None:
        for name, p in params.items():
            on = active.view(-1, *([1] * (p.dim() - 1)))
            d = grads[name] if cfg.weight_decay == 0 else grads[name] + cfg.weight_decay * p
            if cfg.momentum > 0:
                buf = state.setdefault(name, torch.zeros_like(p))
                buf.copy_(torch.where(on, cfg.momentum * buf + d, buf))
                d = buf
            p.sub_(torch.where(on, cfg.lr * d, torch.zeros_like(d)))

    return step


def stacked_adam(
    cfg: TrainConfig, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
) -> Callable[[Stacked, Stacked, Stacked, torch.Tensor], None]:
    """``torch.optim.Adam``'s update (L2 weight decay, bias correction by each client's own
    step count) on stacked parameters, in place."""
    b1, b2 = betas

    def step(params: Stacked, grads: Stacked, state: Stacked, active: torch.Tensor) -> None:
        t = state.setdefault("__step__", torch.zeros(active.shape, device=active.device))
        t.add_(active.to(t.dtype))
        for name, p in params.items():
            on = active.view(-1, *([1] * (p.dim() - 1)))
            g = grads[name] if cfg.weight_decay == 0 else grads[name] + cfg.weight_decay * p
            m = state.setdefault(f"{name}.m", torch.zeros_like(p))
            v = state.setdefault(f"{name}.v", torch.zeros_like(p))
            m.copy_(torch.where(on, b1 * m + (1 - b1) * g, m))
            v.copy_(torch.where(on, b2 * v + (1 - b2) * g * g, v))
            shape = (-1, *([1] * (p.dim() - 1)))
            count = t.clamp(min=1).view(shape)
            bias1, bias2 = 1 - b1**count, 1 - b2**count
            update = (cfg.lr / bias1) * m / (v.sqrt() / bias2.sqrt() + eps)
            p.sub_(torch.where(on, update, torch.zeros_like(update)))

    return step


def clip_stacked(grads: Stacked, max_norm: float) -> None:
    """``clip_grad_norm_`` per client: each client's gradients scaled to at most ``max_norm``
    (global L2 norm over its parameters), in place."""
    total = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads.values():
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


def train_chunk(
    chunk: Sequence[Job],
    task: TaskInfo,
    *,
    seed: int,
    device: torch.device,
    tracker: Tracker | None = None,
) -> dict[int, Trained | str]:
    """Train a chunk of jobs (one :func:`group_key`) together (see the module docs).

    Returns:
        client id → its :class:`Trained` model, or why it could not be trained here (a loss
        that stopped being finite): such a client is left to the sequential loop, which
        reports it as it always does.
    """
    start = time.perf_counter()
    recipe = chunk[0].recipe
    cfg = recipe.train
    model = initial_model(recipe.arch, task, seed, recipe.extra_outputs, cfg.init).to(device)
    g = len(chunk)
    params: Stacked = {
        k: v.detach().unsqueeze(0).repeat(g, *([1] * v.dim())).contiguous()
        for k, v in model.named_parameters()
    }
    data_x = torch.cat([j.data.x for j in chunk]).to(device)
    data_y = torch.cat([j.data.y for j in chunk]).to(device)
    offsets = [0]
    for j in chunk:
        offsets.append(offsets[-1] + len(j.data))
    schedules = [_Schedule(j, seed) for j in chunk]
    steps = [0] * g
    failed: dict[int, str] = {}
    state: Stacked = {}
    update = stacked_adam(cfg) if cfg.optimizer == "adam" else stacked_sgd(cfg)

    def loss(p: Stacked, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(functional_call(model, p, (x,)), y, reduction="none")
        return (ce * m).sum() / m.sum().clamp(min=1)

    step_fn = vmap(grad_and_value(loss), randomness="different")
    model.train()
    longest = max(s.total for s in schedules)
    with (tracker or NullTracker()).task(f"{g} clients together ({recipe.arch})", longest) as adv:
        while True:
            batches = [s.next() if i not in failed else None for i, s in enumerate(schedules)]
            if all(b is None for b in batches):
                break
            width = max(len(b) for b in batches if b is not None)
            index = torch.zeros(g, width, dtype=torch.long)
            mask = torch.zeros(g, width)
            for i, b in enumerate(batches):
                if b is not None:
                    index[i, : len(b)] = b + offsets[i]
                    mask[i, : len(b)] = 1.0
                    steps[i] += 1
            active = (mask.sum(1) > 0).to(device)
            index, mask = index.to(device), mask.to(device)
            grads, values = step_fn(params, data_x[index], data_y[index], mask)
            bad = ~torch.isfinite(values) & active
            if bool(bad.any()):
                for i in bad.nonzero().flatten().tolist():
                    failed[i] = f"loss became {float(values[i])} at step {steps[i] - 1}"
                active = active & ~bad
            if cfg.grad_clip > 0:
                clip_stacked(grads, cfg.grad_clip)
            update(params, grads, state, active)
            adv(1)
    seconds = time.perf_counter() - start
    total = max(1, sum(steps))
    out: dict[int, Trained | str] = {}
    for i, job in enumerate(chunk):
        if i in failed:
            out[job.client_id] = failed[i]
            continue
        member = initial_model(recipe.arch, task, seed, recipe.extra_outputs, cfg.init)
        member.load_state_dict({k: v[i].detach().cpu() for k, v in params.items()}, strict=True)
        out[job.client_id] = Trained(member.eval(), steps[i], seconds * steps[i] / total)
    return out


def train_together(
    jobs: Sequence[Job],
    task: TaskInfo,
    *,
    seed: int,
    device: torch.device,
    client_batch: int,
    tracker: Tracker | None = None,
) -> dict[int, Trained | str]:
    """Every job trained in chunks of at most ``client_batch`` clients (:func:`chunks`)."""
    out: dict[int, Trained | str] = {}
    for chunk in chunks(jobs, client_batch):
        out.update(train_chunk(chunk, task, seed=seed, device=device, tracker=tracker))
    return out


__all__ = [
    "Job",
    "Trained",
    "chunks",
    "clip_stacked",
    "group_key",
    "stackable",
    "stacked_adam",
    "stacked_sgd",
    "train_chunk",
    "train_together",
]
