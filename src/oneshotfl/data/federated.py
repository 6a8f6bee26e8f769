"""Federated data: a dataset carved into a public pool, client shards and the test split.

Order of carving, each step from its own named stream of the partition seed:

1. optionally a random subset of ``max_train`` training examples (tiny runs);
2. the public pool: ``public_size`` random training examples, kept as inputs only
   (:class:`~oneshotfl.data.types.UnlabelledData`) — their labels are dropped here;
3. the partition of what remains over the clients;
4. per client, a random ``val_fraction`` held out as its validation split;
5. optionally a feature skew (:mod:`oneshotfl.data.feature_skew`): each client's shard in its
   own domain, the public pool and the test split a seeded mixture of the client domains.

The test split is the dataset's own and is used for evaluation only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from oneshotfl.data.feature_skew import Domains, FeatureSkew, Stats, mixture_domains
from oneshotfl.data.partition_base import Partitioner, PartitionError
from oneshotfl.data.types import Dataset, IndexedData, LabelledData, TaskInfo, UnlabelledData
from oneshotfl.seeding import numpy_rng


@dataclass(frozen=True)
class ClientShard:
    """One client's private data.

    Attributes:
        client_id: the client's id.
        train: training examples.
        val: validation examples (``None`` when no split is held out).
        indices: the examples' indices in the dataset's training split.
    """

    client_id: int
    train: LabelledData
    val: LabelledData | None
    indices: np.ndarray


@dataclass(frozen=True)
class FederatedData:
    """Everything a run needs from the data side.

    Attributes:
        task: the task's public facts.
        clients: the client shards, in client-id order (a Flower node holds only its own).
        public: the unlabelled public pool, if one was carved.
        test: the test split (evaluation only).
    """

    task: TaskInfo
    clients: tuple[ClientShard, ...]
    public: UnlabelledData | None
    test: LabelledData

    def label_histograms(self) -> np.ndarray:
        """``[clients, classes]`` training-example counts."""
        return np.stack(
            [np.bincount(c.train.y.numpy(), minlength=self.task.num_classes) for c in self.clients]
        )

    def shard(self, client_id: int) -> ClientShard:
        """The shard of client ``client_id``.

        Raises:
            KeyError: when this data holds no such client.
        """
        shard = self._by_id.get(client_id)
        if shard is None:
            raise KeyError(f"client {client_id}: not among the shards held here")
        return shard

    @cached_property
    def _by_id(self) -> dict[int, ClientShard]:
        """Client id → shard (the first with that id), built once: a run of 10,000 clients
        looks a shard up twice a client."""
        index: dict[int, ClientShard] = {}
        for shard in self.clients:
            index.setdefault(shard.client_id, shard)
        return index

    def only(self, client_id: int, shard: ClientShard | None = None) -> FederatedData:
        """This data with only client ``client_id``'s shard (a node's view); ``shard``: the
        node's own shard instead of the carved one (:func:`own_shard`)."""
        own = self.shard(client_id) if shard is None else shard
        return FederatedData(self.task, (own,), self.public, self.test)


class OwnDataError(ValueError):
    """A node's own dataset that does not fit the federation's task."""


def own_shard(
    dataset: Dataset,
    task: TaskInfo,
    client_id: int,
    *,
    val_fraction: float,
    seed: int,
    by_name: bool,
) -> ClientShard:
    """A node's shard from its own dataset (every example of it, its train and test parts
    alike), with the validation split held out as for a carved shard.

    Labels map onto the task's classes by name when ``by_name`` (an image folder's class
    subfolders must each be a class of the task), else by index (each must be below the
    task's classes). Images must have the task's channels and side.

    Raises:
        OwnDataError: naming what the task expects and what the dataset has.
    """
    shape = (dataset.in_channels, dataset.image_size)
    if shape != (task.in_channels, task.image_size):
        raise OwnDataError(
            f"{dataset.name}: expected images of {task.in_channels} channel(s) and side "
            f"{task.image_size} (the task's), got {shape[0]} and {shape[1]}"
        )
    x = torch.cat([dataset.train.x, dataset.test.x])
    y = torch.cat([dataset.train.y, dataset.test.y])
    if by_name:
        unknown = sorted(set(dataset.class_names) - set(task.class_names))
        if unknown:
            raise OwnDataError(
                f"{dataset.name}: expected classes among the task's {list(task.class_names)}, "
                f"got {unknown}"
            )
        index = torch.tensor([task.class_names.index(c) for c in dataset.class_names])
        y = index[y]
    elif len(y) and int(y.max()) >= task.num_classes:
        raise OwnDataError(
            f"{dataset.name}: expected labels 0..{task.num_classes - 1} (the task's classes), "
            f"got {int(y.max())}"
        )
    data = LabelledData(x, y)
    return _make_shard(data, client_id, np.arange(len(data)), val_fraction, seed)


def carve_federated_data(
    dataset: Dataset,
    *,
    clients: int,
    partitioner: Partitioner,
    seed: int,
    public_size: int = 0,
    max_train: int | None = None,
    val_fraction: float = 0.0,
    feature_skew: FeatureSkew | None = None,
    stats: Stats | None = None,
    lazy: bool = False,
) -> FederatedData:
    """Carve the public pool, partition the rest, hold out validation splits (see the module
    docs for the order); every step draws from its own stream of the partition ``seed``.
    ``stats`` is the dataset's normalisation (a colour skew undoes it; default: none).
    ``lazy``: the shards hold indices into ``dataset`` and gather their rows when read
    (:class:`~oneshotfl.data.types.IndexedData`; the same values), not copies.

    Raises:
        PartitionError: when the pool leaves no examples or the partitioner cannot split.
    """
    pool = np.arange(len(dataset.train))
    if max_train is not None and max_train < len(pool):
        pool = np.sort(numpy_rng(seed, "max_train").choice(pool, max_train, replace=False))
    public_idx, pool = _carve_public(pool, public_size, seed)
    if clients > len(pool):
        held = [f"{len(dataset.test)} are the test split"] if len(dataset.test) else []
        if max_train is not None and max_train < len(dataset.train):
            held.append(f"max_train keeps {max_train} of the {len(dataset.train)} for training")
        if public_idx is not None and len(public_idx):
            held.append(f"{len(public_idx)} go to the public pool (public_size)")
        why = f" (of {len(dataset.train) + len(dataset.test)} examples, {'; '.join(held)})"
        raise PartitionError(
            f"clients (--clients): expected at most the {len(pool)} training examples left to "
            f"split, one per client{why if held else ''}, got {clients} clients"
        )
    labels = dataset.train.y.numpy()[pool]
    parts = partitioner.split(labels, clients, numpy_rng(seed, "partition"))
    empty = [cid for cid, part in enumerate(parts) if len(part) == 0]
    if empty:
        named = ", ".join(map(str, empty[:10])) + (", …" if len(empty) > 10 else "")
        raise PartitionError(
            f"partition: expected every client to hold at least one example, got {len(empty)} "
            f"of {clients} clients with none (client {named}); use fewer clients or a "
            "partition that gives each client some (min_samples >= 1)"
        )
    shards = tuple(
        _make_shard(dataset.train, cid, pool[part], val_fraction, seed, lazy)
        for cid, part in enumerate(parts)
    )
    public = None
    if public_idx is not None:
        public = UnlabelledData(dataset.train.x[torch.as_tensor(public_idx)])
    test = dataset.test
    channels = dataset.in_channels
    if feature_skew is not None:
        shards, public, test = _skewed(feature_skew, shards, public, test, clients, seed, stats)
        channels = feature_skew.channels(channels)
    task = TaskInfo(
        dataset.name,
        dataset.num_classes,
        channels,
        dataset.image_size,
        tuple(dataset.class_names),
    )
    return FederatedData(task, shards, public, test)


def _skewed(
    skew: FeatureSkew,
    shards: tuple[ClientShard, ...],
    public: UnlabelledData | None,
    test: LabelledData,
    clients: int,
    seed: int,
    stats: Stats | None,
) -> tuple[tuple[ClientShard, ...], UnlabelledData | None, LabelledData]:
    """Every client's shard in its own domain; the pool and the test split in a mixture."""
    c = int(test.x.shape[1])
    stats = stats or Stats((0.0,) * c, (1.0,) * c)

    def move(x: torch.Tensor, domains: np.ndarray, stream: str) -> torch.Tensor:
        return skew.apply(x, Domains(domains, clients, stats, stream, seed))

    def own(data: LabelledData, cid: int, split: str) -> LabelledData:
        domains = np.full(len(data), cid)
        return LabelledData(move(data.x, domains, f"{split} {cid}"), data.y)

    moved = tuple(
        ClientShard(
            s.client_id,
            own(s.train, s.client_id, "train"),
            None if s.val is None else own(s.val, s.client_id, "val"),
            s.indices,
        )
        for s in shards
    )
    if public is not None:
        domains = mixture_domains(len(public), clients, seed, "public")
        public = UnlabelledData(move(public.x, domains, "public"))
    domains = mixture_domains(len(test), clients, seed, "test")
    return moved, public, LabelledData(move(test.x, domains, "test"), test.y)


def diagnostic_split(test: LabelledData, size: int, seed: int) -> LabelledData:
    """A class-stratified sample of ``size`` test examples, drawn from the partition ``seed``'s
    stream ``"diagnostics"`` — what each client's own model is checked on (its
    ``local_test_accuracy``), so that this per-client diagnostic costs the same at any test
    split's size; ``size`` 0 or at least the split: the whole split.

    Each class keeps its share: ``⌊size·n_c/N⌋`` examples, and the remaining ones go to the
    classes with the largest remainders (ties to the lower class); the sample keeps the
    split's order.
    """
    n = len(test)
    if size <= 0 or size >= n:
        return test
    labels = test.y.numpy()
    classes, counts = np.unique(labels, return_counts=True)
    exact = size * counts / n
    take = np.floor(exact).astype(np.int64)
    order = np.lexsort((classes, -(exact - take)))  # largest remainder first, then class
    take[order[: size - int(take.sum())]] += 1
    rng = numpy_rng(seed, "diagnostics")
    chosen = [
        rng.choice(np.flatnonzero(labels == c), k, replace=False)
        for c, k in zip(classes, take, strict=True)
    ]
    return test.subset(torch.as_tensor(np.sort(np.concatenate(chosen))))


def _carve_public(
    pool: np.ndarray, public_size: int, seed: int
) -> tuple[np.ndarray | None, np.ndarray]:
    if public_size == 0:
        return None, pool
    if public_size >= len(pool):
        raise PartitionError(
            f"public_size: expected fewer than the {len(pool)} training examples available, "
            f"got {public_size}"
        )
    perm = numpy_rng(seed, "public").permutation(pool)
    return np.sort(perm[:public_size]), np.sort(perm[public_size:])


def _make_shard(
    train: LabelledData,
    cid: int,
    indices: np.ndarray,
    val_fraction: float,
    seed: int,
    lazy: bool = False,
) -> ClientShard:
    def rows(index: np.ndarray) -> LabelledData:
        idx = torch.as_tensor(index)
        return IndexedData(train, idx) if lazy else train.subset(idx)

    indices = np.sort(indices)
    n_val = round(val_fraction * len(indices))
    if n_val == 0:
        return ClientShard(cid, rows(indices), None, indices)
    perm = numpy_rng(seed, "val", cid).permutation(indices)
    val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    return ClientShard(cid, rows(train_idx), rows(val_idx), train_idx)
