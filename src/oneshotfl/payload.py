"""Payloads: what one client sends, and the wire format every payload crosses.

A :class:`Payload` is named NumPy arrays plus scalars, nothing else. It serialises with
safetensors (never pickle): scalars travel as JSON in the safetensors metadata. The same
:func:`encode` / :func:`decode` pair serves the local simulation, the artefact cache and the
Flower adapter, so the bytes counted in a simulation are the bytes that would cross a network.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

Scalar = int | float | str | bool
_SCALARS_KEY = "oneshotfl.scalars"


class WireError(ValueError):
    """Bytes that are not a well-formed oneshotfl payload (e.g. a pickle file)."""


@dataclass(frozen=True)
class Payload:
    """One message: named arrays and scalars.

    Attributes:
        arrays: name → array (any dtype safetensors supports).
        scalars: name → int, float, str or bool.
    """

    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    scalars: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.arrays.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"payload array {name!r} must be a numpy.ndarray, got {type(value).__name__}"
                )
        for name, scalar in self.scalars.items():
            if not isinstance(scalar, int | float | str | bool):
                raise TypeError(
                    f"payload scalar {name!r} must be int, float, str or bool, "
                    f"got {type(scalar).__name__}"
                )

    def merged(self, other: Payload) -> Payload:
        """This payload with ``other``'s fields added; a name in both is an error."""
        clash = (set(self.arrays) & set(other.arrays)) | (set(self.scalars) & set(other.scalars))
        if clash:
            raise ValueError(f"payload fields given twice: {sorted(clash)}")
        return Payload({**self.arrays, **other.arrays}, {**self.scalars, **other.scalars})


def encode(payload: Payload) -> bytes:
    """Serialise a payload to safetensors bytes (arrays contiguous, scalars in metadata)."""
    # Not np.ascontiguousarray: it turns 0-d arrays (BatchNorm's counters) into shape (1,).
    arrays = {k: np.array(v, order="C", copy=True) for k, v in payload.arrays.items()}
    metadata = {_SCALARS_KEY: json.dumps(dict(payload.scalars), sort_keys=True)}
    return bytes(st_save(arrays, metadata=metadata))


def decode(data: bytes) -> Payload:
    """Parse safetensors bytes back into a payload.

    Raises:
        WireError: when the bytes are not a safetensors file written by :func:`encode`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(f"expected payload bytes, got {type(data).__name__}")
    raw = bytes(data)
    try:
        arrays = st_load(raw)
        header_len = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + header_len])
    except Exception as exc:  # safetensors raises its own error types for any malformed input
        raise WireError(
            f"expected a safetensors payload, got {len(raw)} bytes that do not parse as one "
            f"({type(exc).__name__}: {exc})"
        ) from None
    meta = header.get("__metadata__") or {}
    if _SCALARS_KEY not in meta:
        raise WireError(f"safetensors bytes lack the {_SCALARS_KEY!r} metadata entry")
    try:
        scalars = json.loads(meta[_SCALARS_KEY])
    except (ValueError, RecursionError) as exc:  # malformed, or nested past the parser's depth
        raise WireError(f"payload scalars are not valid JSON: {type(exc).__name__}") from None
    if not isinstance(scalars, dict):
        raise WireError(f"payload scalars must be a JSON object, got {type(scalars).__name__}")
    for name, value in scalars.items():
        if not isinstance(value, int | float | str | bool):
            kind = "null" if value is None else type(value).__name__
            raise WireError(
                f"payload scalar {name!r}: expected an int, float, string or bool, got {kind}"
            )
    return Payload({k: np.asarray(arrays[k]) for k in sorted(arrays)}, scalars)
