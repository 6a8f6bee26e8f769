"""The runner's errors: a requirement a federation does not meet, a quorum not reached, and
the one-line forms they are reported in."""

from __future__ import annotations

from collections.abc import Sequence

from oneshotfl.runner.config import ConfigError


class RequirementError(ConfigError):
    """A method needs something this federation does not provide."""


class QuorumError(RuntimeError):
    """Too few valid payloads (or receivers' reports) arrived."""


def refuse(problems: Sequence[str]) -> None:
    """Raise one :class:`RequirementError` naming every problem (``cannot run: a; b``); none:
    return."""
    if problems:
        raise RequirementError("cannot run: " + "; ".join(problems))


def first_line(exc: BaseException) -> str:
    """The first line of an error's message ("" when it has none)."""
    return (str(exc).strip().splitlines() or [""])[0]


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
