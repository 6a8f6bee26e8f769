"""The runner's errors: a requirement a federation does not meet, a quorum not reached."""

from __future__ import annotations

from oneshotfl.runner.config import ConfigError


class RequirementError(ConfigError):
    """A method needs something this federation does not provide."""


class QuorumError(RuntimeError):
    """Too few valid payloads (or receivers' reports) arrived."""
