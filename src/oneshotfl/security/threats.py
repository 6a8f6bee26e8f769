"""Simulated malicious clients, for robustness studies (``malicious`` and ``attack`` settings).

With ``malicious=m`` the clients 0 … m−1 (the partition is random, so these are m random
shards) follow the registered attack given by ``attack`` (``name[:key=value...]``); several
attacks joined by ``+`` (``garbage+oversize:mib=8``) are dealt out in turn, malicious client
``i`` following attack ``i mod k`` (a mixed adversary, or several checks in one run). An
attack acts where a real malicious client would, on the client itself: on its data before it
trains (:meth:`Attack.poison`) and on its message before it leaves (:meth:`Attack.tamper`,
which sees the method's payload spec, so it knows which arrays are model weights and which
are probability rows). A Flower node builds the same context, so it misbehaves exactly as in
the simulation. Everything an attack sends is well formed: it passes the wire's checks, and
only the aggregation rule stands between it and the result.

* ``label_flip`` — trains on flipped labels y → C−1−y (data poisoning).
* ``scale`` — every float tensor of its model(s) multiplied by ``factor`` (a boosted update).
* ``noise`` — its model tensors replaced by Gaussian noise of ``std`` times each tensor's own
  standard deviation (BatchNorm variances by its absolute value), and its probability rows by
  rows drawn uniformly from the simplex.
* ``wrong_predictions`` — its probability rows replaced by one-hot rows on the class after
  its own argmax (confident and wrong).
* ``over_report`` — trains on flipped labels (``flip=true``, the default; ``false`` trains
  honestly) and claims the largest training-set size the wire accepts (``n_examples`` =
  N_max, the federation's whole training pool) to dominate size-weighted aggregation; the
  bound caps the claim, ``weighting=clipped`` caps its weight.

Three more send what the wire must refuse, to check that it does, on a Flower node as in the
simulation (the run goes on without that client, who is named): ``garbage`` (every array
replaced by seven random numbers), ``oversize:mib=8`` (an extra array of that size) and
``wrong_arch:arch=cnn`` (a valid model of another architecture than the configured one).

An attack that cannot act on a method's payload (``scale`` or ``wrong_predictions`` where
there is no model or no probability row) is refused before any training
(:meth:`Attack.misfit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from oneshotfl.data.types import LabelledData
from oneshotfl.models import MODELS, create_model
from oneshotfl.params import Params, coerce_params, require
from oneshotfl.payload import Payload
from oneshotfl.protocol.fields import model_fields
from oneshotfl.protocol.spec import PayloadSpec, WireDims
from oneshotfl.registry import Registry, parse_spec


class AttackError(ValueError):
    """An attack spec that cannot be built, or an attack that does not fit the payload."""


@dataclass(frozen=True)
class NoOptions(Params):
    """An attack without options."""


class Attack:
    """Base of registered attacks: honest by default on both hooks."""

    Config: ClassVar[type] = NoOptions

    def __init__(self, config: Any, spec: str) -> None:
        self.config, self.spec = config, spec

    def poison(self, data: LabelledData, num_classes: int) -> LabelledData:
        """The data the malicious client trains on."""
        return data

    def misfit(self, spec: PayloadSpec) -> str | None:
        """Why this attack cannot act on payloads of ``spec`` (checked before any training),
        or ``None``."""
        return None

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        """The message the malicious client sends instead of ``payload``."""
        return payload


ATTACKS: Registry[type[Attack]] = Registry("attack")


def model_keys(payload: Payload, spec: PayloadSpec) -> list[str]:
    """The float arrays of ``payload`` that belong to a model field of ``spec``."""
    return [
        k
        for k, v in payload.arrays.items()
        if v.dtype.kind == "f" and any(m.owns(k) for m in spec.models)
    ]


def probability_keys(spec: PayloadSpec) -> list[str]:
    """The arrays of ``spec`` that hold probability rows."""
    return [a.name for a in spec.arrays if a.simplex]


@ATTACKS.register("label_flip", "trains on flipped labels y → C−1−y")
class LabelFlip(Attack):
    def poison(self, data: LabelledData, num_classes: int) -> LabelledData:
        return LabelledData(data.x, num_classes - 1 - data.y)


@dataclass(frozen=True)
class ScaleConfig(Params):
    """Attributes: factor: what every model tensor is multiplied by."""

    factor: float = 10.0


@ATTACKS.register("scale", "model tensors multiplied by factor (a boosted update)")
class Scale(Attack):
    Config = ScaleConfig

    def misfit(self, spec: PayloadSpec) -> str | None:
        return None if spec.models else "needs a payload that carries a model"

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        keys = model_keys(payload, spec)
        if not keys:
            raise AttackError(f"attack {self.spec!r}: the payload carries no model to scale")
        factor = np.float32(self.config.factor)
        arrays = {
            k: (v * factor).astype(v.dtype) if k in keys else v for k, v in payload.arrays.items()
        }
        return Payload(arrays, payload.scalars)


@dataclass(frozen=True)
class NoiseConfig(Params):
    """Attributes: std: the noise's standard deviation, in units of each tensor's own."""

    std: float = 1.0

    def validate(self) -> None:
        require(self.std > 0, "std", "> 0", self.std)


@ATTACKS.register("noise", "model tensors and probability rows replaced by random noise")
class Noise(Attack):
    Config = NoiseConfig

    def misfit(self, spec: PayloadSpec) -> str | None:
        fits = spec.models or probability_keys(spec)
        return None if fits else "needs a payload with a model or probability rows"

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        arrays = dict(payload.arrays)
        for key in model_keys(payload, spec):
            v = arrays[key]
            scale = self.config.std * (float(v.std()) or 1.0)
            noise = rng.normal(0.0, scale, v.shape)
            if key.endswith("running_var"):  # a variance stays a variance: the wire checks it
                noise = np.abs(noise)
            arrays[key] = noise.astype(v.dtype)
        for key in probability_keys(spec):
            v = arrays[key]
            rows = rng.dirichlet(np.ones(v.shape[-1]), v.shape[:-1])
            arrays[key] = rows.astype(v.dtype)
        return Payload(arrays, payload.scalars)


@ATTACKS.register("wrong_predictions", "confident wrong predictions: one-hot on another class")
class WrongPredictions(Attack):
    def misfit(self, spec: PayloadSpec) -> str | None:
        return None if probability_keys(spec) else "needs a prediction-sharing payload"

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        keys = probability_keys(spec)
        if not keys:
            raise AttackError(
                f"attack {self.spec!r}: expected a prediction-sharing payload, got one "
                "without probability rows"
            )
        arrays = dict(payload.arrays)
        for key in keys:
            v = arrays[key]
            wrong = (v.argmax(-1) + 1) % v.shape[-1]
            arrays[key] = np.eye(v.shape[-1], dtype=v.dtype)[wrong]
        return Payload(arrays, payload.scalars)


@dataclass(frozen=True)
class OverReportConfig(Params):
    """Attributes: flip: train on flipped labels as well (a poisoned model with a big claim)."""

    flip: bool = True


@ATTACKS.register("over_report", "claims n_examples = N_max (the most the wire accepts)")
class OverReport(Attack):
    Config = OverReportConfig

    def poison(self, data: LabelledData, num_classes: int) -> LabelledData:
        return LabelledData(data.x, num_classes - 1 - data.y) if self.config.flip else data

    def misfit(self, spec: PayloadSpec) -> str | None:
        names = {scalar.name for scalar in spec.scalars}
        return None if "n_examples" in names else "needs a payload that reports n_examples"

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        if dims.max_examples <= 0:
            raise AttackError(f"attack {self.spec!r}: expected a known N_max, got none")
        return Payload(payload.arrays, {**payload.scalars, "n_examples": dims.max_examples})


ATTACK_JOIN = "+"
"""What joins several attacks in one ``attack`` setting (so no option value may hold it)."""


def build_attacks(spec: str) -> tuple[Attack, ...]:
    """The attacks of an ``attack`` setting: one spec, or several joined by ``+``, in order.

    Raises:
        AttackError: for an empty part, an unknown name or a bad option.
    """
    parts = [p.strip() for p in spec.split(ATTACK_JOIN)]
    if not all(parts):
        raise AttackError(
            f"attack {spec!r}: expected attacks joined by '{ATTACK_JOIN}', got an empty one"
        )
    return tuple(build_attack(p) for p in parts)


def build_attack(spec: str) -> Attack:
    """The registered attack named by ``spec`` (``name[:key=value...]``).

    Raises:
        AttackError: for an unknown name or a bad option.
    """
    try:
        name, options = parse_spec(spec, "attack")
        kind = ATTACKS.get(name)
        return kind(coerce_params(kind.Config, options), spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise AttackError(f"attack {spec!r}: {exc}") from None


@ATTACKS.register("garbage", "every array replaced by seven random numbers (refused)")
class Garbage(Attack):
    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        arrays = {k: rng.random(7).astype(np.float32) for k in payload.arrays}
        return Payload(arrays, payload.scalars)


@dataclass(frozen=True)
class OversizeConfig(Params):
    """Attributes: mib: the size of the extra array, in MiB."""

    mib: float = 8.0

    def validate(self) -> None:
        require(0 < self.mib <= 1024, "mib", "in (0, 1024]", self.mib)


@ATTACKS.register("oversize", "an extra array of mib MiB appended (refused)")
class Oversize(Attack):
    Config = OversizeConfig

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        padding = np.zeros(int(self.config.mib * 2**20) // 4, np.float32)
        return Payload({**payload.arrays, "padding": padding}, payload.scalars)


@dataclass(frozen=True)
class WrongArchConfig(Params):
    """Attributes: arch: the architecture sent instead of the configured one."""

    arch: str = "cnn"

    def validate(self) -> None:
        require(self.arch in MODELS, "arch", "a registered model", self.arch)


@ATTACKS.register("wrong_arch", "a valid model of another architecture than configured (refused)")
class WrongArch(Attack):
    Config = WrongArchConfig

    def misfit(self, spec: PayloadSpec) -> str | None:
        return None if spec.models else "needs a payload that carries a model"

    def tamper(
        self, payload: Payload, spec: PayloadSpec, dims: WireDims, rng: np.random.Generator
    ) -> Payload:
        model = spec.models[0]
        shape = model.model_dims(dims)
        other = create_model(
            self.config.arch,
            shape.in_channels,
            shape.num_classes + model.extra_outputs,
            shape.image_size,
        )
        kept = {k: v for k, v in payload.arrays.items() if not model.owns(k)}
        fields = model_fields(other, model.prefix)
        return Payload({**kept, **fields.arrays}, {**payload.scalars, **fields.scalars})
