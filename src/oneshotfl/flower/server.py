"""The server side through Flower: one message per node per round (the round 0 of several
methods in one, ``batch-updates``), over a Grid.

:func:`run_server` is the ServerApp's body. It resolves the experiment exactly like a local
run (same config, same checks, same federation rebuilt from the server's copy of the data
for the public pool, the test split and the result bookkeeping) and runs it with the same
engine; Flower supplies only the transport, a
:class:`~oneshotfl.flower.transport.GridTransport`.

Nodes that did not answer (gone, too slow, or failed) are named in the result; below the
quorum the run fails with a :class:`~oneshotfl.runner.errors.QuorumError` that names them.

Run config keys (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``):

* ``config``: a YAML experiment config on the server ("" = defaults);
* ``overrides``: space-separated ``key=value`` config overrides;
* ``out``: the results directory on the server ("" = ``runs/flower-<timestamp>``);
* ``node-timeout``: seconds to wait for ``clients`` nodes to connect (and, with a
  ``node-clients`` binding, every bound node);
* ``reply-timeout``: seconds to wait for a node's reply, from the push of its instruction;
* ``in-flight``: the most instructions outstanding at once (0 = every node's at once); the
  next is pushed as one is answered or times out. On one host with many SuperNodes (each
  instruction starts a ClientApp process) it bounds how many run at once;
* ``node-clients``: the deployment's binding of node ids to client ids, space-separated
  ``NODE=CLIENT`` ("" = none). With CLI-managed SuperNode authentication a node id is bound
  to the key it registered (``flwr supernode register`` prints it), so with a binding a
  registered node cannot claim another node's client id: a reply for any other client is
  refused and named, and a node outside the binding is never addressed;
* ``batch-updates``: ``true`` (the default) asks each node for the round 0 of every method
  that needs no broadcast in one message (:mod:`oneshotfl.flower.batch`: one ClientApp
  process per node, not one per method); ``false``: one message per method and round, each
  method's payloads held by the server only while it runs;
* ``cohort-size``: under Flower's simulation engine, the most clients one virtual node holds
  and answers for in one message (:mod:`oneshotfl.flower.cohort`; start
  ``ceil(clients / cohort-size)`` SuperNodes; a node answering for more is refused); a
  cohort message waits ``reply-timeout × cohort-size`` seconds, and ``in-flight`` counts
  messages, so cohorts; 0 (the default, and a deployment's only mode): one client per node;
* ``shared-data``: the folder of the machine's memory-mapped copy of the dataset
  (:mod:`oneshotfl.data.shared`; "" = ``$ONESHOTFL_SHARED_DATA`` or the temp folder,
  ``off`` = load into the process's own memory).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from oneshotfl.data.shared import load_shared, shared_folder
from oneshotfl.flower.grid import GridLike, placement, send_and_receive, wait_for_nodes
from oneshotfl.flower.settings import ServerSettings, parse_binding
from oneshotfl.flower.transport import MESSAGE_TYPE, GridTransport
from oneshotfl.runner.config import ConfigError, load_config
from oneshotfl.runner.experiment import run_experiment
from oneshotfl.runner.federation import Federation
from oneshotfl.runner.plan import Plan, preflight
from oneshotfl.runner.results import write_partial, write_result

__all__ = [
    "MESSAGE_TYPE", "GridTransport", "ServerSettings", "parse_binding", "run_server",
    "send_and_receive",
]  # fmt: skip

log = logging.getLogger(__name__)


def run_server(grid: GridLike, run_config: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """Run every configured method through ``grid``; write and return the result document.

    Args:
        grid: the ServerApp's Grid (or a test double).
        run_config: Flower's run config (keys in the module docs).
        mode: how Flower runs (``simulation`` or ``deployment``), for the result file.

    Raises:
        ConfigError: for a config that cannot run (before any message is sent).
        QuorumError: when a round gets fewer valid payloads than the quorum.
    """
    settings = ServerSettings.from_run_config(run_config)
    if settings.cohort_size and mode == "deployment":
        raise ConfigError(
            "run config cohort-size: cohorts are for Flower's simulation engine; a deployment "
            f"keeps one client per SuperNode (cohort-size = 0), got {settings.cohort_size}"
        )
    cfg = load_config(settings.config, settings.overrides)
    if (settings.out / "result.json").exists():
        raise ConfigError(f"{settings.out}/result.json exists; choose another out")
    connected: list[GridTransport] = []

    def connect(federation: Federation, plan: Plan) -> GridTransport:
        """After the checks, before any message: wait for the nodes, open the transport."""
        binding, size = settings.node_clients, settings.cohort_size
        wanted = -(-cfg.clients // size) if size else cfg.clients
        nodes = wait_for_nodes(grid, wanted, settings.node_timeout, required=binding)
        strangers = [n for n in nodes if binding and n not in binding]
        for node in strangers:
            log.warning("node %d is not in the deployment's node-clients: not addressed", node)
        nodes = [n for n in nodes if n not in strangers]
        together = [
            key for key, method in plan.methods
            if settings.batch_updates and method.broadcast_spec(federation.dims, 0) is None
        ]  # fmt: skip
        transport = GridTransport(
            grid, plan.node_config(), nodes, settings.reply_timeout, dict(plan.specs),
            binding=binding, in_flight=settings.in_flight,
            batch=together if len(together) > 1 else [], cohort_size=size, clients=cfg.clients,
        )  # fmt: skip
        log.info("running %d method(s) over %d Flower nodes", len(plan.methods), len(nodes))
        connected.append(transport)
        return transport

    plan = preflight(cfg)
    folder = shared_folder(settings.shared_data)
    dataset = load_shared(cfg.dataset, cfg.data_root, cfg.download, folder)

    def partial(doc: dict[str, Any]) -> None:  # a run cut short keeps what finished
        write_partial(settings.out, doc | {"flower": {"mode": mode, "partial": True}})

    doc = run_experiment(plan, connect=connect, dataset=dataset, lazy=True, partial=partial)
    (transport,) = connected
    doc["flower"] = {
        "mode": mode,
        "nodes": len(transport.nodes),
        "node_clients": {str(n): c for n, c in sorted(transport.node_clients.items())},
        "no_reply": {m["key"]: m["no_reply"] for m in doc["methods"] if m.get("no_reply")},
        "reply_timeout_s": settings.reply_timeout,
        "in_flight": settings.in_flight,
        "batch_updates": settings.batch_updates,
        "cohort_size": settings.cohort_size,
        "cohorts": {str(n): list(c) for n, c in sorted(transport.cohorts.items())},
        "binding": {str(n): c for n, c in sorted(settings.node_clients.items())},
        "placement": placement(transport.placement),
    }
    write_result(settings.out, doc, title_suffix=" (Flower)")
    log.info("results: %s", settings.out / "result.json")
    return doc
