"""Validation of a payload against its :class:`~oneshotfl.protocol.spec.PayloadSpec` on
receipt: names, dtypes, shapes, finite values, ranges, probability rows, scalars, and each
model's architecture, tensors and outputs against a freshly built reference of the
federation's shapes (of the sending client's configured architecture when it is known).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from oneshotfl.models import MODELS, create_model
from oneshotfl.models.state import forward_with_state
from oneshotfl.payload import Payload
from oneshotfl.protocol.spec import (
    ArraySpec,
    FieldGroup,
    ModelSpec,
    PayloadError,
    PayloadSpec,
    ScalarSpec,
    WireDims,
)


def validate_payload(
    payload: Payload, spec: PayloadSpec, dims: WireDims, client: int | None = None
) -> None:
    """Check ``payload`` against ``spec``; raise :class:`PayloadError` on the first problem.

    Checks names (missing and unexpected), dtypes, shapes, finite values, value ranges,
    probability rows, scalar types, and each model's architecture, keys, shapes, dtypes and
    class count.
    """
    owners: list[ModelSpec | FieldGroup] = [*spec.models, *spec.groups]
    model_keys = {k for k in payload.arrays if any(m.owns(k) for m in owners)}
    _check_names(payload, spec, model_keys, client)
    bound: dict[str, int] = dims.symbols()
    for array_spec in spec.arrays:
        _check_array(payload.arrays[array_spec.name], array_spec, bound, client)
    for scalar_spec in spec.scalars:
        _check_scalar(payload.scalars[scalar_spec.name], scalar_spec, bound, client)
    for model_spec in spec.models:
        check_model(payload, model_spec, dims, client)
    for group in spec.groups:
        group.check(payload, dims, client)


def _check_names(
    payload: Payload, spec: PayloadSpec, model_keys: set[str], client: int | None
) -> None:
    want_arrays = {a.name for a in spec.arrays}
    want_scalars = {s.name for s in spec.scalars} | {m.arch_key for m in spec.models}
    want_scalars |= {k for k in payload.scalars if any(g.owns(k) for g in spec.groups)}
    for name in sorted(want_arrays - set(payload.arrays)):
        raise PayloadError(name, "an array", "nothing (missing)", client)
    for name in sorted(want_scalars - set(payload.scalars)):
        raise PayloadError(name, "a scalar", "nothing (missing)", client)
    for name in sorted(set(payload.arrays) - want_arrays - model_keys):
        raise PayloadError(name, "no such array in the spec", "an unexpected array", client)
    for name in sorted(set(payload.scalars) - want_scalars):
        raise PayloadError(name, "no such scalar in the spec", "an unexpected scalar", client)


def _check_array(
    value: np.ndarray, spec: ArraySpec, bound: dict[str, int], client: int | None
) -> None:
    if value.dtype.name not in spec.dtypes:
        raise PayloadError(spec.name, f"dtype in {list(spec.dtypes)}", value.dtype.name, client)
    if value.ndim != len(spec.shape):
        raise PayloadError(
            spec.name, f"{len(spec.shape)} dims {spec.shape}", f"shape {value.shape}", client
        )
    for axis, (dim, got) in enumerate(zip(spec.shape, value.shape, strict=True)):
        want = dim if isinstance(dim, int) else bound.setdefault(dim, got)
        if want != got:
            label = "the class count " if dim == "C" else ""
            raise PayloadError(
                spec.name, f"{label}{want} on axis {axis} ({dim})", f"shape {value.shape}", client
            )
    _check_values(value, spec, client)


def _check_values(value: np.ndarray, spec: ArraySpec, client: int | None) -> None:
    if value.size == 0:
        return
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        bad = int((~np.isfinite(value)).sum())
        raise PayloadError(spec.name, "finite values", f"{bad} NaN/inf entries", client)
    if spec.value_range is not None:
        low, high = spec.value_range
        vmin, vmax = value.min(), value.max()
        if vmin < low or vmax > high:
            raise PayloadError(
                spec.name, f"values in [{low}, {high}]", f"range [{vmin}, {vmax}]", client
            )
    total = float(value.astype(np.float64).sum())
    if spec.min_sum is not None and total < spec.min_sum:
        raise PayloadError(
            spec.name, f"elements summing to at least {spec.min_sum:g}", "less", client
        )
    if spec.max_sum is not None and total > spec.max_sum:
        raise PayloadError(
            spec.name, f"elements summing to at most {spec.max_sum:g}", f"{total:g}", client
        )
    if spec.simplex:
        sums = value.astype(np.float64).sum(axis=-1)
        worst = float(np.abs(sums - 1.0).max())
        if worst > 1e-2:
            raise PayloadError(spec.name, "rows summing to 1", f"a row off by {worst:.3g}", client)


INT64 = (-(2**63), 2**63 - 1)


def _check_scalar(
    value: object, spec: ScalarSpec, bound: Mapping[str, int], client: int | None
) -> None:
    ok = isinstance(value, spec.kind) and not (spec.kind is int and isinstance(value, bool))
    if spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise PayloadError(spec.name, spec.kind.__name__, type(value).__name__, client)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise PayloadError(
            spec.name, "an integer that fits in int64", f"{len(str(value))} digits", client
        )
    if isinstance(value, float) and not np.isfinite(value):
        raise PayloadError(spec.name, "a finite number", repr(value), client)
    if spec.minimum is not None and value < spec.minimum:
        raise PayloadError(spec.name, f"a value >= {spec.minimum}", repr(value), client)
    top = bound.get(spec.maximum) if isinstance(spec.maximum, str) else spec.maximum
    if top is not None and value > top:
        what = f" ({spec.maximum})" if isinstance(spec.maximum, str) else ""
        raise PayloadError(spec.name, f"a value <= {top}{what}", repr(value), client)
    if spec.equals is not None and spec.equals in bound and value != bound[spec.equals]:
        raise PayloadError(
            spec.name, f"{bound[spec.equals]}, the rows sent ({spec.equals})", repr(value), client
        )


def check_model(payload: Payload, spec: ModelSpec, dims: WireDims, client: int | None) -> None:
    """Check the model ``spec`` names in ``payload`` (architecture, tensors, outputs)."""
    arch = payload.scalars[spec.arch_key]
    allowed = spec.archs or tuple(MODELS.names())
    if not isinstance(arch, str) or arch not in allowed:
        raise PayloadError(spec.arch_key, f"an architecture in {list(allowed)}", repr(arch), client)
    configured = expected_arch(spec, dims, client)
    if configured is not None and arch != configured:
        raise PayloadError(
            spec.arch_key,
            f"{configured!r}, the architecture this client is configured with",
            repr(arch),
            client,
        )
    try:
        reference = reference_state(arch, spec.model_dims(dims), spec.extra_outputs)
    except Exception as exc:  # the registry refuses this task (e.g. an image too small)
        raise PayloadError(
            spec.arch_key,
            "an architecture that can be built for this task",
            f"{arch!r} ({type(exc).__name__}: {exc})",
            client,
        ) from None
    got = {k[len(spec.prefix) + 1 :]: v for k, v in payload.arrays.items() if spec.owns(k)}
    for key in sorted(set(reference) - set(got)):
        raise PayloadError(f"{spec.prefix}.{key}", f"a tensor of {arch}", "nothing", client)
    for key in sorted(set(got) - set(reference)):
        raise PayloadError(f"{spec.prefix}.{key}", f"no such tensor in {arch}", "one", client)
    for key, ref in reference.items():
        value, name = got[key], f"{spec.prefix}.{key}"
        if tuple(value.shape) != tuple(ref.shape):
            what = "the class count in " if key.startswith("head.") else ""
            raise PayloadError(name, f"{what}shape {tuple(ref.shape)}", str(value.shape), client)
        want_dtype = str(ref.dtype).removeprefix("torch.")
        if value.dtype.name != want_dtype:
            raise PayloadError(name, f"dtype {want_dtype}", value.dtype.name, client)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise PayloadError(name, "finite values", "NaN/inf entries", client)
        if key.endswith("running_var") and (value < 0).any():
            raise PayloadError(name, "non-negative BatchNorm variances", "negative ones", client)
    _check_outputs(payload, spec, dims, client)


def _check_outputs(payload: Payload, spec: ModelSpec, dims: WireDims, client: int | None) -> None:
    """The model must answer a zero input with finite logits (weights that are each finite
    can still overflow, or a BatchNorm layer divide by a negative variance's root)."""
    model_dims = spec.model_dims(dims)
    side = model_dims.image_size
    # on the CPU, where the payload's arrays are
    probe = torch.zeros(1, model_dims.in_channels, side, side, device="cpu")
    out = forward_with_state(  # the payload's arrays run in a shared module: none built
        str(payload.scalars[spec.arch_key]),
        payload.arrays,
        model_dims.in_channels,
        model_dims.num_classes + spec.extra_outputs,
        side,
        probe,
        spec.prefix,
    )
    if not torch.isfinite(out).all():
        raise PayloadError(
            spec.arch_key,
            "a model with finite outputs",
            "non-finite logits on a zero input",
            client,
        )


def expected_arch(spec: ModelSpec, dims: WireDims, client: int | None) -> str | None:
    """The one architecture a model field may carry: the sending client's configured one for a
    model of the task's inputs without an allowed list (a head on embeddings, or a spec that
    names its architectures, is not the client's classifier); ``None`` when not known here."""
    if spec.archs or spec.input_dims is not None:
        return None
    return dims.client_arch(client)


_REFERENCE_CACHE: dict[tuple[str, int, int, int], dict[str, torch.Tensor]] = {}


def reference_state(arch: str, dims: WireDims, extra_outputs: int = 0) -> dict[str, torch.Tensor]:
    """The state dict (shapes and dtypes) of ``arch`` built for this federation; memoised."""
    key = (arch, dims.in_channels, dims.num_classes + extra_outputs, dims.image_size)
    if key not in _REFERENCE_CACHE:
        with torch.device("meta"):  # shapes and dtypes only: no memory, no RNG draws
            model = create_model(arch, dims.in_channels, key[2], dims.image_size)
        _REFERENCE_CACHE[key] = {k: v.detach() for k, v in model.state_dict().items()}
    return _REFERENCE_CACHE[key]
