"""Flower records to Python values and back, checked: wire bytes in an ArrayRecord, typed
fields of a ConfigRecord, JSON text (the helpers of :mod:`oneshotfl.flower.messages`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from oneshotfl.payload import WireError

BYTES_STYPE = "oneshotfl.safetensors"
"""The ``stype`` of an array that holds wire bytes (safetensors, never pickle)."""


class MessageError(WireError):
    """A Flower message that does not hold what the oneshotfl protocol expects."""


def bytes_record(blobs: Mapping[str, bytes]) -> ArrayRecord:
    """Wire bytes as an ArrayRecord of ``uint8`` arrays (no copy of the meaning, no pickle)."""
    record = ArrayRecord()
    for name, blob in blobs.items():
        record[name] = Array(dtype="uint8", shape=(len(blob),), stype=BYTES_STYPE, data=blob)
    return record


def record_bytes(record: ArrayRecord) -> dict[str, bytes]:
    """The wire bytes back out of :func:`bytes_record`.

    Raises:
        MessageError: for an array that was not written by :func:`bytes_record`.
    """
    out: dict[str, bytes] = {}
    for name, array in record.items():
        if array.stype != BYTES_STYPE or array.dtype != "uint8":
            raise MessageError(
                f"payload {name!r}: expected stype {BYTES_STYPE!r} with dtype uint8, "
                f"got stype {array.stype!r} with dtype {array.dtype!r}"
            )
        if tuple(array.shape) != (len(array.data),):
            raise MessageError(
                f"payload {name!r}: shape {tuple(array.shape)} does not match its "
                f"{len(array.data)} bytes"
            )
        out[name] = bytes(array.data)
    return out


def is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_value(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, a 5000-digit int, deep nesting
        raise MessageError(
            f"{name}: expected JSON, got {text[:80]!r} ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None


def config_record(content: RecordDict, name: str) -> ConfigRecord:
    if name not in content.config_records:
        raise MessageError(
            f"expected a {name!r} ConfigRecord, got records {sorted(content.keys())}"
        )
    return content.config_records[name]


def typed_fields(record: ConfigRecord, name: str, types: Mapping[str, type]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field_name, kind in types.items():
        value = record.get(field_name)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise MessageError(
                f"{name}.{field_name}: expected {kind.__name__}, got {type(value).__name__}"
            )
        out[field_name] = value
    return out
