"""What a method needs from the federation (:class:`Requires`, :class:`Topology`) and the
wire dims every party resolves payload shapes against (:func:`wire_dims`); re-exported by
:mod:`oneshotfl.protocol.contract`."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from oneshotfl.data.types import TaskInfo, UnlabelledData
from oneshotfl.protocol.spec import WireDims, task_dims
from oneshotfl.training.services import Encoder


class Topology(enum.StrEnum):
    """Who talks to whom: clients to one server, or clients to their graph neighbours."""

    STAR = "star"
    PEER = "peer"


@dataclass(frozen=True)
class Requires:
    """What a method needs from the federation.

    Attributes:
        public_data: an unlabelled public pool (``public_size > 0``).
        shared_encoder: a frozen encoder known to every party.
        same_architecture: every client uses the same model architecture.
        server_model: a server architecture (``server_model``) is configured.
        topology: star (server) or peer (server-free, over the neighbour graph).
        min_clients: fewest clients the method can work with.
        data_free: the server needs nothing but the uploaded messages; the runner then
            hands it no public pool (``ServerContext.public`` is None), so it provably sees
            no data.
        validation: every client holds a private validation split (``val_fraction > 0``).
        images: the method corrupts, crops, blurs or generates images, and needs the task's
            inputs to be images of at least this side (0: any input, a table of features —
            read as a 1×1 "image" of D channels — included). Checked once the data is loaded,
            before any training (:func:`oneshotfl.runner.checks.image_problems`).
        image_multiple: the image side must also be a multiple of this (1: any side); a
            generator that upsamples twice by 2 (DENSE's, IntactOFL's) needs 4.
    """

    public_data: bool = False
    shared_encoder: bool = False
    same_architecture: bool = False
    server_model: bool = False
    topology: Topology = Topology.STAR
    min_clients: int = 1
    data_free: bool = False
    validation: bool = False
    images: int = 0
    image_multiple: int = 1

    def __post_init__(self) -> None:
        if self.images < 0 or self.image_multiple < 1:
            raise ValueError(
                f"Requires: expected images >= 0 and image_multiple >= 1, got images="
                f"{self.images}, image_multiple={self.image_multiple}"
            )

    def takes_side(self, side: int) -> bool:
        """Whether inputs of ``side`` (a table's: 1) give the method the images it needs."""
        return side >= self.images and side % self.image_multiple == 0

    @property
    def image_need(self) -> str:
        """The images the method needs, in words ("" when it takes any input)."""
        if self.takes_side(1):
            return ""
        least = max(self.images, self.image_multiple)
        multiple = f", a multiple of {self.image_multiple}" if self.image_multiple > 1 else ""
        return f"images of side >= {least}{multiple}"


def wire_dims(
    task: TaskInfo,
    public: UnlabelledData | None,
    encoder: Encoder | None,
    archs: Sequence[str] = (),
    max_examples: int = 0,
) -> WireDims:
    """The wire dims every party resolves payload shapes against: the task, the public pool's
    size, ``D``, the shared encoder's embedding size (when there is an encoder), the client
    architectures the party knows and ``N_max``, the most examples one client can hold."""
    size = 0 if public is None else len(public)
    dim = None if encoder is None else encoder.dim
    return task_dims(task, size, dim, tuple(archs), max_examples)
