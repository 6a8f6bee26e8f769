"""The wire: bound → deserialise → validate.

Every payload crosses it, in simulation as over Flower, so a method can never rely on
anything that would not survive a real network, and a malformed message is refused at the
boundary with a sentence naming the client, the field, what was expected and what came.
Bytes beyond what the method's spec can take are refused before anything is decoded
(:func:`byte_limit`), and whatever goes wrong while one payload is decoded or checked becomes
a refusal of that payload (a :class:`WireError` or :class:`PayloadError` naming the client),
never an error that stops the run.
"""

from __future__ import annotations

import numpy as np

from oneshotfl.models import MODELS
from oneshotfl.payload import Payload, WireError, decode, encode
from oneshotfl.protocol.spec import PayloadError, PayloadSpec, WireDims
from oneshotfl.protocol.validate import expected_arch, reference_state, validate_payload

HEADER_ALLOWANCE = 64 * 1024
"""Bytes a payload may spend beyond its tensors: the safetensors header (names, shapes,
offsets) and the scalars' JSON."""


def byte_limit(spec: PayloadSpec, dims: WireDims, client: int | None = None) -> int | None:
    """The most bytes a payload of ``spec`` can take for this federation: every array at its
    largest allowed dtype with its symbols resolved (a symbol no dim names is bounded by
    ``N_max``), every model at its largest allowed (or the configured) architecture, plus
    :data:`HEADER_ALLOWANCE` and 256 bytes per tensor. ``None`` when a dimension has no bound
    here (then the run's byte ceiling alone applies)."""
    bound = dims.symbols()
    total, tensors = HEADER_ALLOWANCE, 0
    for array in spec.arrays:
        size = max(np.dtype(d).itemsize for d in array.dtypes)
        for dim in array.shape:
            value = dim if isinstance(dim, int) else bound.get(dim, bound.get("N_max"))
            if value is None:
                return None
            size *= value
        total, tensors = total + size, tensors + 1
    for model in spec.models:
        configured = expected_arch(model, dims, client)
        archs = [configured] if configured else list(model.archs or MODELS.names())
        largest, count = 0, 0
        for arch in archs:
            try:
                state = reference_state(arch, model.model_dims(dims), model.extra_outputs)
            except Exception:  # cannot be built here: a payload naming it is refused anyway
                continue
            largest = max(largest, sum(v.numel() * v.element_size() for v in state.values()))
            count = max(count, len(state))
        if count == 0:  # no allowed architecture can be built here: validation refuses it
            return None
        total, tensors = total + largest, tensors + count
    for group in spec.groups:
        bounded = group.bound(dims, client)
        if bounded is None:
            return None
        total, tensors = total + bounded[0], tensors + bounded[1]
    return total + 256 * tensors


def receive(data: bytes, spec: PayloadSpec, dims: WireDims, client: int | None) -> Payload:
    """Bound, decode and validate one client's bytes.

    Raises:
        WireError: bytes over :func:`byte_limit`, bytes that are no payload, or anything else
            that went wrong while checking them (named by client).
        PayloadError: a payload that does not match ``spec``.
    """
    who = f"client {client}: " if client is not None else ""
    limit = byte_limit(spec, dims, client)
    if limit is not None and len(data) > limit:
        raise WireError(f"{who}expected at most {limit} bytes for this payload, got {len(data)}")
    try:
        payload = decode(data)
        validate_payload(payload, spec, dims, client)
    except PayloadError:
        raise
    except WireError as exc:
        raise WireError(f"{who}{exc}") from None
    except Exception as exc:  # a check that broke on hostile input is still a refusal
        raise WireError(
            f"{who}the payload could not be checked ({type(exc).__name__}: {exc})"
        ) from None
    return payload


def transmit(
    payload: Payload, spec: PayloadSpec, dims: WireDims, client: int | None
) -> tuple[Payload, int]:
    """Send ``payload`` through the wire in-process; returns what arrived and its size."""
    data = encode(payload)
    return receive(data, spec, dims, client), len(data)
