"""One-shot FedAvg: one round of McMahan et al. (2017), "Communication-Efficient Learning of
Deep Networks from Decentralized Data" (AISTATS).

Every client starts from the shared initial model, trains ``local_epochs`` on its data and
sends its weights with its example count; the server returns the data-size-weighted average
of the parameters (and buffers: BatchNorm statistics are averaged the same way, integer
counters are rounded). Requires identical architectures. The example counts are the clients'
own reports (bounded to [1, N_max] on the wire); ``weighting=clipped`` caps each at twice the
median so one client cannot take the average by over-reporting, ``uniform`` ignores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oneshotfl.functional import Weighting
from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import SendsTrainedModel, average_models
from oneshotfl.params import Params
from oneshotfl.protocol.contract import Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.payload import Payload


@dataclass(frozen=True)
class FedAvgConfig(Params):
    """FedAvg hyper-parameters.

    Attributes:
        weighting: ``size`` (n_k, the paper), ``clipped`` (n_k capped at twice the median)
            or ``uniform``.
    """

    weighting: Weighting = "size"


@register_method("fedavg", "one round of FedAvg: data-size-weighted parameter average")
class FedAvg(SendsTrainedModel[FedAvgConfig]):
    """One-shot FedAvg (McMahan et al. 2017)."""

    Config = FedAvgConfig
    requires = Requires(same_architecture=True)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return GlobalModel(average_models(payloads, ctx.dims, self.config.weighting))
