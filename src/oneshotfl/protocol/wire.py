"""The wire: serialise → count bytes → deserialise → validate.

Every payload crosses it, in simulation as over Flower, so a method can never rely on
anything that would not survive a real network, and a malformed message is refused at the
boundary with a sentence naming the client, the field, what was expected and what came.
"""

from __future__ import annotations

from oneshotfl.protocol.payload import Payload, decode, encode
from oneshotfl.protocol.spec import PayloadSpec, WireDims, validate_payload


def receive(data: bytes, spec: PayloadSpec, dims: WireDims, client: int | None) -> Payload:
    """Decode and validate one client's bytes (raises ``WireError`` or ``PayloadError``)."""
    payload = decode(data)
    validate_payload(payload, spec, dims, client)
    return payload


def transmit(
    payload: Payload, spec: PayloadSpec, dims: WireDims, client: int | None
) -> tuple[Payload, int]:
    """Send ``payload`` through the wire in-process; returns what arrived and its size."""
    data = encode(payload)
    return receive(data, spec, dims, client), len(data)
