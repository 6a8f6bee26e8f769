"""FOL's variants as registered methods (presets of :class:`~oneshotfl.methods.fol.FolConfig`).

FOL-A collects every neighbour in contact (``per_round=0``); FOL-N skips the alignment-aware
pruning (``prune=false``); FOL-AN both — the paper's Tables 1 and 2 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from oneshotfl.methods.base import register_method
from oneshotfl.methods.fol import Fol, FolConfig


@dataclass(frozen=True)
class FolAConfig(FolConfig):
    """FOL-A: every neighbour in contact is collected (no Q limit)."""

    per_round: int = 0


@dataclass(frozen=True)
class FolNConfig(FolConfig):
    """FOL-N: no alignment-aware pruning (received models are fine-tuned only)."""

    prune: bool = False


@dataclass(frozen=True)
class FolANConfig(FolConfig):
    """FOL-AN: no Q limit and no alignment-aware pruning."""

    per_round: int = 0
    prune: bool = False


@register_method("fol-a", "FOL-A: FOL collecting every neighbour in contact (no Q limit)")
class FolA(Fol):
    """FOL with ``per_round=0``."""

    Config = FolAConfig


@register_method("fol-n", "FOL-N: FOL without alignment-aware pruning (fine-tuning only)")
class FolN(Fol):
    """FOL with ``prune=false``."""

    Config = FolNConfig


@register_method("fol-an", "FOL-AN: no Q limit and no alignment-aware pruning")
class FolAN(Fol):
    """FOL with ``per_round=0`` and ``prune=false``."""

    Config = FolANConfig
