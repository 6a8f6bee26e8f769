"""Plain containers for in-memory data.

Images are held as normalised ``float32`` tensors ``[N, C, H, W]`` and labels as ``int64``
tensors ``[N]``; every dataset in the registry is small enough for this on one machine, and
slicing tensors by index is far faster than a ``DataLoader`` for small models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oneshotfl.fingerprints import tensor_fingerprint


@dataclass(frozen=True)
class LabelledData:
    """Inputs with their labels."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"inputs and labels differ in length: expected equal, got {self.x.shape[0]} "
                f"inputs and {self.y.shape[0]} labels"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def fingerprint(self) -> str:
        """``tensor_fingerprint(x, y)``, hashed once: memoised on this object while its tensors
        are the same and unchanged (their storage and in-place version counters), so a
        client's shard is hashed once however many keys and records name it."""
        stamp = self._stamp()
        memo = self.__dict__.get("_fingerprint")
        if memo is None or memo[0] != stamp:
            memo = (stamp, tensor_fingerprint(self.x, self.y))
            object.__setattr__(self, "_fingerprint", memo)
        return str(memo[1])

    def _stamp(self) -> tuple[object, ...]:
        return tuple((id(t), t.data_ptr(), t._version) for t in (self.x, self.y))

    def subset(self, index: torch.Tensor | list[int]) -> LabelledData:
        """The rows at ``index`` (a copy)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return LabelledData(self.x[idx], self.y[idx])


class IndexedData(LabelledData):
    """The rows of ``source`` at ``index``, gathered each time ``x`` or ``y`` is read: what
    a process that plays many clients holds (a node of Flower's simulation engine serves
    hundreds of virtual clients from one carve), so a carve costs indices, not a second copy
    of the training set. Reads give the same values as :meth:`LabelledData.subset`."""

    source: LabelledData
    index: torch.Tensor

    def __init__(self, source: LabelledData, index: torch.Tensor) -> None:
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "index", torch.as_tensor(index, dtype=torch.long))

    @property
    def x(self) -> torch.Tensor:
        return self.source.x[self.index]

    @property
    def y(self) -> torch.Tensor:
        return self.source.y[self.index]

    def _stamp(self) -> tuple[object, ...]:  # the source's and the index's, not a gather's
        index = self.index
        return (*self.source._stamp(), id(index), index.data_ptr(), index._version)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def subset(self, index: torch.Tensor | list[int]) -> LabelledData:
        """The rows at ``index`` of these rows (a copy)."""
        idx = self.index[torch.as_tensor(index, dtype=torch.long)]
        return LabelledData(self.source.x[idx], self.source.y[idx])


@dataclass(frozen=True)
class UnlabelledData:
    """Inputs only. The server's view of the public pool: by type it has no labels to leak."""

    x: torch.Tensor

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class Dataset:
    """A dataset from the registry: its train and test splits and what models need to know."""

    name: str
    train: LabelledData
    test: LabelledData
    num_classes: int
    class_names: tuple[str, ...]

    @property
    def in_channels(self) -> int:
        return int(self.train.x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train.x.shape[-1])


@dataclass(frozen=True)
class TaskInfo:
    """Public facts of the learning task that every party knows.

    Attributes:
        dataset: the dataset's registry name.
        num_classes: C.
        in_channels: image channels.
        image_size: image height and width.
        class_names: the classes' names, when the dataset has them.
    """

    dataset: str
    num_classes: int
    in_channels: int
    image_size: int
    class_names: tuple[str, ...] = ()
