"""What a run built, saved: a method's final model(s) as one safetensors file, and back.

``oneshotfl run --save-models`` (``oneshotfl.run(..., save_models=True)``) writes, beside
``result.json``, ``models/<method key>.safetensors`` for every star method: the same payload
fields a model crosses the wire in (``<prefix>.arch`` and its state dict, no pickle), plus what
rebuilds the outcome — a :class:`~oneshotfl.protocol.outcome.GlobalModel`'s model
(``model.*``), or an :class:`~oneshotfl.protocol.outcome.Ensemble`'s members
(``member<i>.*``), weights and combining rule. ``Result.load_model(key)`` reads it back into
the same outcome, ready for ``predict_proba(x, device)``.

A model that is not one registry architecture (FedAGE's encoder + head, IntactOFL's mixture of
experts) is saved as its state dict (``state.*``) with its class name, so nothing is lost; it
is loaded by building that module and calling ``load_state_dict``. Server-free methods have no
final model at a server — each client keeps its own — and save none.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from oneshotfl.models.aggregator import StackedAggregator
from oneshotfl.payload import Payload, WireError, decode, encode
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Outcome
from oneshotfl.protocol.spec import WireDims
from oneshotfl.registry import RegistryError

MODELS_DIR = "models"


class SavedModelError(ValueError):
    """A saved model that cannot be rebuilt as an outcome here."""


def _registered(module: nn.Module) -> bool:
    return isinstance(getattr(module, "arch", None), str)


def _extra(module: nn.Module, classes: int) -> int:
    return int(getattr(module, "num_classes", classes)) - classes


def outcome_payload(outcome: Outcome, classes: int) -> Payload:
    """``outcome`` as payload fields (see the module docs); ``classes``: the task's."""
    if isinstance(outcome, GlobalModel) and _registered(outcome.model):
        fields = model_fields(outcome.model.cpu(), "model")
        extra = _extra(outcome.model, classes)
        return fields.merged(Payload({}, {"outcome": "GlobalModel", "extra_outputs": extra}))
    if isinstance(outcome, Ensemble) and all(_registered(m) for m in outcome.members):
        payload = Payload({"weights": np.asarray(outcome.weights, np.float32)}, {})
        for i, member in enumerate(outcome.members):
            payload = payload.merged(model_fields(member.cpu(), f"member{i}"))
        scalars: dict[str, int | float | str | bool] = {
            "outcome": "Ensemble",
            "rule": outcome.rule,
            "members": len(outcome.members),
            "extra_outputs": _extra(outcome.members[0], classes),
        }
        agg = outcome.aggregator
        if agg is not None:
            state = {
                f"aggregator.{k}": v.detach().cpu().numpy() for k, v in agg.state_dict().items()
            }
            payload = payload.merged(Payload(state, {}))
            scalars |= {"aggregator": agg.kind, "aggregator_hidden": agg.hidden}
        return payload.merged(Payload({}, scalars))
    modules = [outcome.model] if isinstance(outcome, GlobalModel) else []
    if isinstance(outcome, Ensemble):
        modules = list(outcome.members)
    arrays = {
        f"state.{i}.{k}": v.detach().cpu().numpy().copy()
        for i, m in enumerate(modules)
        for k, v in m.state_dict().items()
    }
    names = ",".join(type(m).__qualname__ for m in modules) or type(outcome).__name__
    return Payload(arrays, {"outcome": type(outcome).__name__, "module": names})


def _aggregator(payload: Payload, members: int, classes: int) -> StackedAggregator | None:
    """The learned aggregator a saved ensemble carries (``None``: it has none)."""
    kind = payload.scalars.get("aggregator")
    if kind is None:
        return None
    if kind not in ("nn", "linear"):
        raise ValueError(f"aggregator: expected nn or linear, got {kind!r}")
    hidden = int(payload.scalars.get("aggregator_hidden", 1))
    agg = StackedAggregator("nn" if kind == "nn" else "linear", members, classes, hidden)
    state = {
        k.removeprefix("aggregator."): torch.from_numpy(np.array(v))
        for k, v in payload.arrays.items()
        if k.startswith("aggregator.")
    }
    agg.load_state_dict(state)
    return agg.eval()


def model_file_name(key: str) -> str:
    """``models/<key>.safetensors`` with the key made a safe file name."""
    return f"{MODELS_DIR}/{re.sub(r'[^A-Za-z0-9_.=+-]+', '_', key)}.safetensors"


def save_outcome(out_dir: Path, key: str, outcome: Outcome, classes: int) -> str:
    """Write ``outcome`` under ``out_dir``; returns its path relative to ``out_dir``."""
    name = model_file_name(key)
    path = out_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(encode(outcome_payload(outcome, classes)))
    tmp.replace(path)
    return name


def load_outcome(path: Path, dims: WireDims) -> Outcome:
    """Rebuild the outcome saved at ``path`` for a task of ``dims``.

    Raises:
        SavedModelError: for a file saved as a plain state dict, or not a saved outcome.
    """
    try:
        payload = decode(path.read_bytes())
    except (OSError, WireError) as exc:
        raise SavedModelError(f"{path}: expected a saved model, got {exc}") from None
    kind = payload.scalars.get("outcome")
    try:
        extra = int(payload.scalars.get("extra_outputs", 0))
        if kind == "GlobalModel" and "model.arch" in payload.scalars:
            return GlobalModel(model_from_fields(payload, dims, "model", extra).eval())
        if kind == "Ensemble" and "members" in payload.scalars:
            members = [
                model_from_fields(payload, dims, f"member{i}", extra).eval()
                for i in range(int(payload.scalars["members"]))
            ]
            weights = torch.from_numpy(np.array(payload.arrays["weights"]))
            agg = _aggregator(payload, len(members), dims.num_classes + extra)
            return Ensemble(members, weights, rule=str(payload.scalars["rule"]), aggregator=agg)
    except (KeyError, ValueError, RuntimeError) as exc:
        hint = (
            "; a model of a plugin architecture needs that plugin imported first"
            if isinstance(exc, RegistryError)
            else ""
        )
        raise SavedModelError(
            f"{path}: cannot rebuild it here ({type(exc).__name__}: {exc}){hint}"
        ) from None
    module = payload.scalars.get("module", "?")
    raise SavedModelError(
        f"{path}: saved as the state dict of {module} ({kind}); build that module and load "
        "the 'state.<i>.*' arrays with load_state_dict"
    )
