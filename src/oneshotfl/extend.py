"""The plugin API: everything a plugin of oneshotfl imports, in one versioned module.

A plugin (``--plugin my_method.py``, ``plugins=["mypkg.methods"]`` or an installed package's
entry point; :mod:`oneshotfl.plugins`) imports from here and nowhere else in oneshotfl::

    from oneshotfl.extend import GlobalModel, SendsTrainedModel, model_from_fields, register_method

What it holds:

* **the version**: :data:`PLUGIN_API_VERSION`, and the entry-point groups a package declares
  its plugins in (:data:`ENTRY_POINT_GROUPS`); :class:`PluginError` is what a plugin that
  cannot be loaded raises;
* **registration**, one decorator per registry: :func:`register_method`,
  :func:`register_model`, :func:`register_dataset`, :func:`register_partitioner`,
  :func:`register_component`, :func:`register_graph`, :func:`register_attack`,
  :func:`register_encoder`, :func:`register_feature_skew`;
* **the method contract**: :class:`Method` (star), :class:`PeerMethod` (server-free),
  :class:`SendsTrainedModel` (the client half that sends its trained model), the contexts
  :class:`ClientContext` and :class:`ServerContext`, :class:`Requires` and :class:`Topology`,
  the hyper-parameters (:class:`Params`, :func:`require`, :class:`NoConfig`),
  :class:`KnownLimit`, the training settings (:class:`TrainConfig`, :class:`ClientRecipe`,
  :class:`ComponentSpec`) and the data a context holds (:class:`TaskInfo`,
  :class:`LabelledData`, :class:`UnlabelledData`); a server step that is a sum over
  clients as a :class:`Fold` (:meth:`Method.fold`, :func:`fold_all`);
* **payloads**: :class:`Payload`, :class:`PayloadSpec` and its fields (:class:`ArraySpec`,
  :class:`ModelSpec`, :class:`ScalarSpec`, :func:`n_examples_spec`), :class:`WireDims`,
  :class:`PayloadError`, a model as payload fields (:func:`model_fields`,
  :func:`model_from_fields`);
* **outcomes**: :data:`Outcome` — :class:`GlobalModel`, :class:`Ensemble` or
  :class:`Personalised`;
* **the helpers the steps of** ``docs/adding-a-method.md`` **name**: a client's training and
  artefacts (:func:`train_model`, :func:`client_artefact`), fresh and received models
  (:func:`shared_initial_model`, :func:`seeded_head`, :func:`client_models`,
  :func:`client_logits`, :func:`average_models`), server-side training (:func:`distil`;
  :func:`synthesise` with :class:`SynthesisConfig`, :class:`SynthesisProblem`,
  :class:`NoAugmentation`, :class:`BatchNormStatistics`), shared math
  (:func:`weighted_member_sum`, :func:`kl_to_student`), random streams
  (:func:`seeded_torch`, :func:`torch_generator`) and :class:`DeviceAudit` for a plugin's
  own tests;
* **what the other registries hold**: :class:`ClassifierModel` (a model factory returns
  one), :class:`DatasetSpec`, :class:`Partitioner` and :class:`PartitionError`,
  :class:`Component` and :class:`ComponentEnv`, :class:`Attack`, :class:`Encoder` with
  :class:`EncoderContext` and :class:`Preprocess`, :class:`FeatureSkew` and :class:`Domains`.

**Versioning.** ``tests/plugin_api.json`` records every name here with its signature (a
class: its constructor and the public members a plugin overrides or calls) and a digest of
the documented example plugins (the plugins page's walkthrough and ``tests/toys.py``);
``tests/test_plugin_api.py`` fails on any difference. A change that removes or changes a
recorded name, signature or member, or that makes an example plugin need an edit, raises the
major version (1.0 → 2.0); one that only adds (names, or optional parameters at the end of a
function's or constructor's) raises the minor version (1.0 → 1.1). Either way
``CHANGELOG.md`` names the new version ("Plugin API 2.0: …") and the manifest is re-recorded
(``python tests/test_plugin_api.py --record``, which refuses a changed surface under an
unchanged version). Anything imported from elsewhere in oneshotfl is internal: it may move or
change without notice.

This module imports torch and every registry; ``import oneshotfl`` does not import it.
"""

from __future__ import annotations

from typing import Any

from oneshotfl.data.dataset_spec import DATASETS, DatasetSpec
from oneshotfl.data.feature_skew import FEATURE_SKEWS, Domains, FeatureSkew
from oneshotfl.data.partition_base import PARTITIONERS, Partitioner, PartitionError
from oneshotfl.data.types import LabelledData, TaskInfo, UnlabelledData
from oneshotfl.devices import DeviceAudit
from oneshotfl.encoders.base import ENCODERS, Encoder, EncoderContext, Preprocess
from oneshotfl.functional import kl_to_student, weighted_member_sum
from oneshotfl.methods.base import register_method
from oneshotfl.methods.builders import (
    client_logits,
    client_models,
    seeded_head,
    shared_initial_model,
)
from oneshotfl.methods.common import SendsTrainedModel, average_models
from oneshotfl.models.base import MODELS, ClassifierModel
from oneshotfl.params import Params, require
from oneshotfl.payload import Payload
from oneshotfl.plugins import GROUPS, PluginError
from oneshotfl.protocol.contract import (
    ClientContext,
    Method,
    NoConfig,
    PeerMethod,
    Requires,
    ServerContext,
    Topology,
)
from oneshotfl.protocol.fields import model_fields, model_from_fields
from oneshotfl.protocol.fold import Fold, fold_all
from oneshotfl.protocol.graph import register_graph
from oneshotfl.protocol.limits import KnownLimit
from oneshotfl.protocol.outcome import Ensemble, GlobalModel, Outcome, Personalised
from oneshotfl.protocol.spec import (
    ArraySpec,
    ModelSpec,
    PayloadError,
    PayloadSpec,
    ScalarSpec,
    WireDims,
    n_examples_spec,
)
from oneshotfl.security.threats import ATTACKS, Attack
from oneshotfl.seeding import seeded_torch, torch_generator
from oneshotfl.training.components import (
    Component,
    ComponentEnv,
    ComponentSpec,
    register_component,
)
from oneshotfl.training.distill import distil
from oneshotfl.training.loop import TrainConfig
from oneshotfl.training.recipe import ClientRecipe
from oneshotfl.training.services import client_artefact, train_model
from oneshotfl.training.synthesis import (
    NoAugmentation,
    SynthesisConfig,
    SynthesisProblem,
    synthesise,
)
from oneshotfl.training.synthesis_terms import BatchNormStatistics

__all__ = [
    "ENTRY_POINT_GROUPS",
    "PLUGIN_API_VERSION",
    "ArraySpec",
    "Attack",
    "BatchNormStatistics",
    "ClassifierModel",
    "ClientContext",
    "ClientRecipe",
    "Component",
    "ComponentEnv",
    "ComponentSpec",
    "DatasetSpec",
    "DeviceAudit",
    "Domains",
    "Encoder",
    "EncoderContext",
    "Ensemble",
    "FeatureSkew",
    "Fold",
    "GlobalModel",
    "KnownLimit",
    "LabelledData",
    "Method",
    "ModelSpec",
    "NoAugmentation",
    "NoConfig",
    "Outcome",
    "Params",
    "PartitionError",
    "Partitioner",
    "Payload",
    "PayloadError",
    "PayloadSpec",
    "PeerMethod",
    "Personalised",
    "PluginError",
    "Preprocess",
    "Requires",
    "ScalarSpec",
    "SendsTrainedModel",
    "ServerContext",
    "SynthesisConfig",
    "SynthesisProblem",
    "TaskInfo",
    "Topology",
    "TrainConfig",
    "UnlabelledData",
    "WireDims",
    "average_models",
    "client_artefact",
    "client_logits",
    "client_models",
    "distil",
    "fold_all",
    "kl_to_student",
    "model_fields",
    "model_from_fields",
    "n_examples_spec",
    "register_attack",
    "register_component",
    "register_dataset",
    "register_encoder",
    "register_feature_skew",
    "register_graph",
    "register_method",
    "register_model",
    "register_partitioner",
    "require",
    "seeded_head",
    "seeded_torch",
    "shared_initial_model",
    "synthesise",
    "torch_generator",
    "train_model",
    "weighted_member_sum",
]

PLUGIN_API_VERSION = "1.2"
"""The version of this surface, ``MAJOR.MINOR``: the major version changes when a change can
break a plugin written against it, the minor when names are only added (``CHANGELOG.md``
says what each version changed)."""

ENTRY_POINT_GROUPS: tuple[str, ...] = tuple(GROUPS)
"""The entry-point groups an installed package declares its plugins in, one per registry
(``[project.entry-points."oneshotfl.methods"]``)."""


def register_model(name: str, description: str = "") -> Any:
    """Function decorator registering a model factory under ``name``: ``factory(in_channels,
    num_classes, image_size)`` returns a :class:`ClassifierModel` (``--model name``)."""
    return MODELS.register(name, description)


def register_dataset(name: str, description: str = "") -> Any:
    """Registers a :class:`DatasetSpec` under ``name``: ``register_dataset("mine")(spec)``
    (``--dataset name``)."""
    return DATASETS.register(name, description)


def register_partitioner(name: str, description: str = "") -> Any:
    """Class decorator registering a :class:`Partitioner` subclass (a frozen dataclass of its
    options) under ``name`` (``--partition name:key=value``)."""
    return PARTITIONERS.register(name, description)


def register_attack(name: str, description: str = "") -> Any:
    """Class decorator registering an :class:`Attack` subclass under ``name``
    (``--attack name:key=value``)."""
    return ATTACKS.register(name, description)


def register_encoder(name: str, description: str = "") -> Any:
    """Function decorator registering an encoder source under ``name``: ``source(options,
    ctx)`` with the spec's options and an :class:`EncoderContext` returns an
    :class:`Encoder` (``--encoder name:key=value``)."""
    return ENCODERS.register(name, description)


def register_feature_skew(name: str, description: str = "") -> Any:
    """Class decorator registering a :class:`FeatureSkew` subclass under ``name``
    (``--feature-skew name:key=value``)."""
    return FEATURE_SKEWS.register(name, description)
