"""Flower Datasets partitioners as oneshotfl partitioners.

``partition: flwr:ClassName[:key=value...]`` (e.g. ``flwr:DirichletPartitioner:alpha=0.1``)
splits the federation with a partitioner class of ``flwr_datasets.partitioner`` (the
``flwr-datasets`` extra) instead of one of ours, so a split defined with Flower Datasets can
be reproduced here. The bridge hands it a Hugging Face dataset holding the label vector and
each example's index, and reads every partition's indices back:

* the rows are handed over in an order drawn from the partition-seed stream (as Flower's
  ``FederatedDataset(shuffle=True)`` does), and ``seed`` defaults to a draw from the same
  stream, so the split follows the experiment's partition seed like every other partitioner;
* ``num_partitions`` is the number of clients (classes that split by a natural id or by
  columns, without ``num_partitions``, are refused); ``partition_by`` defaults to
  ``"label"``; an ``alpha`` the spec does not give comes from the config's ``alpha`` (for
  classes that take one); the config's ``min_samples`` does not apply (Flower's own
  ``min_partition_size`` does, where the class has one);
* values are read as YAML scalars (``alpha=0.1`` a float, ``self_balancing=true`` a bool);
* partitions must be disjoint (a class that samples with overlap is refused); examples a
  partitioner leaves unassigned stay unused.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from oneshotfl.data.partition_base import FLWR_PREFIX, Partitioner, PartitionError, _check_inputs

_EXTRA = "pip install 'oneshotfl[flwr-datasets]'"


def _partitioner_class(name: str) -> type:
    try:
        import flwr_datasets.partitioner as module
    except ImportError:
        raise ValueError(f"expected the flwr-datasets package ({_EXTRA}), got none") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, module.Partitioner)) or name == "Partitioner":
        known = sorted(
            n
            for n, c in vars(module).items()
            if isinstance(c, type) and issubclass(c, module.Partitioner) and n != "Partitioner"
        )
        raise ValueError(f"expected a flwr_datasets partitioner ({', '.join(known)}), got {name!r}")
    return cls


@dataclass(frozen=True)
class FlowerPartitioner(Partitioner):
    """A ``flwr_datasets.partitioner`` class run on our label vector (see the module docs).

    Attributes:
        class_name: the partitioner class, e.g. ``DirichletPartitioner``.
        options: its keyword arguments from the spec, as ``(name, value)`` pairs.
        alpha: the config's ``alpha``, used when the class takes one and the spec gives none.
    """

    class_name: str
    options: tuple[tuple[str, Any], ...] = ()
    alpha: float | None = None

    @classmethod
    def from_spec(cls, spec: str, alpha: float | None = None) -> FlowerPartitioner:
        """Parse ``flwr:ClassName[:key=value...]``.

        Raises:
            ValueError: for a malformed spec, an unknown class or option, or a missing extra.
        """
        name, *pairs = spec.removeprefix(FLWR_PREFIX).split(":")
        options = []
        for pair in pairs:
            key, sep, text = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"{spec!r}: expected key=value after the class, got {pair!r}")
            options.append((key, yaml.safe_load(text)))
        return cls(name, tuple(options), alpha)

    def validate(self) -> None:
        signature = inspect.signature(_partitioner_class(self.class_name))
        if "num_partitions" not in signature.parameters:
            raise ValueError(
                f"{self.class_name}: expected a partitioner that takes num_partitions (the "
                "number of clients); this one splits by a natural id or by columns"
            )
        unknown = sorted({k for k, _ in self.options} - set(signature.parameters) - {"self"})
        if unknown or "num_partitions" in dict(self.options):
            allowed = ", ".join(
                p for p in signature.parameters if p not in ("self", "num_partitions")
            )
            raise ValueError(
                f"{self.class_name}: expected options among {allowed} (num_partitions is the "
                f"number of clients), got {', '.join(unknown) or 'num_partitions'}"
            )

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        from datasets import Dataset as HFDataset

        labels = _check_inputs(labels, num_clients)
        cls = _partitioner_class(self.class_name)
        accepts = inspect.signature(cls).parameters
        kwargs: dict[str, Any] = {"num_partitions": num_clients, **dict(self.options)}
        defaults = {"partition_by": "label", "alpha": self.alpha}
        for key, value in defaults.items():
            if key in accepts and key not in kwargs and value is not None:
                kwargs[key] = value
        if "seed" in accepts and "seed" not in kwargs:
            kwargs["seed"] = int(rng.integers(2**31 - 1))
        order = rng.permutation(len(labels))  # as FederatedDataset(shuffle=True): rows in a
        try:  # seeded order, so partitioners that cut the rows in blocks follow the seed too
            partitioner = cls(**kwargs)
            partitioner.dataset = HFDataset.from_dict(
                {"label": labels[order].tolist(), "_index": order.tolist()}
            )
            # a slice reads the column at once (``["_index"]`` is a lazy column, read row by row)
            parts = [
                np.sort(np.asarray(partitioner.load_partition(i)[:]["_index"], dtype=np.int64))
                for i in range(num_clients)
            ]
        except (ValueError, TypeError) as exc:
            raise PartitionError(f"{self.class_name}: {exc}") from None
        joined = np.concatenate(parts)
        if len(np.unique(joined)) != len(joined):
            raise PartitionError(f"{self.class_name}: expected disjoint partitions, got overlap")
        return parts
