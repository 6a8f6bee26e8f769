"""One-shot FedAvg: one round of McMahan et al. (2017), "Communication-Efficient Learning of
Deep Networks from Decentralized Data" (AISTATS).

Every client starts from the shared initial model, trains ``local_epochs`` on its data and
sends its weights with its example count; the server returns the data-size-weighted average
of the parameters (and buffers: BatchNorm statistics are averaged the same way, integer
counters are rounded). Requires identical architectures.
"""

from __future__ import annotations

from collections.abc import Mapping

from oneshotfl.methods.base import register_method
from oneshotfl.methods.common import SendsTrainedModel, average_models
from oneshotfl.protocol.contract import NoConfig, Requires, ServerContext
from oneshotfl.protocol.outcome import GlobalModel, Outcome
from oneshotfl.protocol.payload import Payload


@register_method("fedavg", "one round of FedAvg: data-size-weighted parameter average")
class FedAvg(SendsTrainedModel[NoConfig]):
    """One-shot FedAvg (McMahan et al. 2017)."""

    requires = Requires(same_architecture=True)

    def aggregate(self, payloads: Mapping[int, Payload], ctx: ServerContext) -> Outcome:
        return GlobalModel(average_models(payloads, ctx.dims))
