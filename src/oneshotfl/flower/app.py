"""The Flower app: a ServerApp and a ClientApp that run any registered method — star methods
aggregated by the ServerApp, peer methods relayed by it.

The components (``oneshotfl.flower.app:server_app`` and ``:client_app``) are what the Flower
app project (``oneshotfl flower app-dir``) names; Flower's simulation engine and a
SuperLink/SuperNode deployment load them alike. Both are thin: the ServerApp calls
:func:`oneshotfl.flower.server.run_server`, the ClientApp
:func:`oneshotfl.flower.node.run_update`; the methods themselves know nothing of Flower.
"""

from __future__ import annotations

import functools
import logging
import socket
import sys

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from oneshotfl.flower.batch import Entry, attempt_each, batch_reply_content
from oneshotfl.flower.cohort import run_cohort
from oneshotfl.flower.grid import WHERE, where_record
from oneshotfl.flower.messages import Instruction, read_instruction, reply_content, report_content
from oneshotfl.flower.node import (
    NodeCache,
    NodeState,
    node_identity,
    node_state,
    run_receive,
    run_update,
)
from oneshotfl.flower.server import run_server

log = logging.getLogger(__name__)

server_app = ServerApp()
client_app = ClientApp()


def _quiet_logging() -> None:
    """Our INFO lines in Flower's logs (Flower configures the root logger's handlers)."""
    logging.getLogger("oneshotfl").setLevel(logging.INFO)


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """Run the configured experiment over the connected nodes and write its results. When a
    method failed the results are written first, then the run ends as failed (Flower's
    status says so, as the command's exit status does), naming each failed method."""
    _quiet_logging()
    mode = "simulation" if type(grid).__name__ == "InMemoryGrid" else "deployment"
    doc = run_server(grid, context.run_config, mode)
    failed = doc.get("failed_methods") or {}
    if failed:
        reasons = "; ".join(f"{key}: {why}" for key, why in failed.items())
        raise MethodsFailedError(f"{len(failed)} method(s) failed (results written): {reasons}")


class MethodsFailedError(RuntimeError):
    """The ServerApp's end when a method failed: every result is written before it."""


NODE_CACHE = NodeCache()
"""This process's node cache: its dataset, federation, node states and built methods."""


@client_app.train("oneshotfl")
def client_main(message: Message, context: Context) -> Message:
    """Answer one instruction: this node's ``client_update`` for one method and round, or
    (a peer method's ``receive`` step) its own model built from the neighbours' bytes the
    ServerApp relayed.

    Any error (a bad node config, data that is not there, a server message that fails
    validation) propagates: Flower returns it to the server as an error reply, and the
    server names this node among those that did not deliver. An instruction with a batch
    (several methods' round 0) answers for each method; one that fails is named in its entry
    and the others are answered (every one failing: the first error propagates). A cohort
    instruction (:mod:`oneshotfl.flower.cohort`) answers for each of its clients alike.
    """
    _quiet_logging()
    instruction = read_instruction(message.content)
    identity = node_identity(context.node_config)
    if instruction.clients is not None:
        content = run_cohort(instruction, identity, NODE_CACHE)
        content[WHERE] = where_record(*_where())
        return Message(content, reply_to=message)
    state = node_state(instruction.config, identity, NODE_CACHE)
    if instruction.batch:
        content = batch_reply_content(_run_batch(state, instruction))
    else:
        method = NODE_CACHE.method(instruction.method)
        if instruction.step == "receive":
            report = run_receive(
                state, method, instruction.method, instruction.payloads, instruction.schedule
            )
            return Message(report_content(report), reply_to=message)
        step = instruction.round, instruction.payloads
        content = reply_content(run_update(state, method, instruction.method, *step))
    content[WHERE] = where_record(*_where())
    return Message(content, reply_to=message)


def _run_batch(state: NodeState, instruction: Instruction) -> list[Entry]:
    """Round 0 of the instruction's method and of each in its batch, in order: each reply, or
    the one-line reason its method failed here (all failing: the first error is raised)."""
    steps = [
        (key, lambda spec=spec: run_update(state, NODE_CACHE.method(spec), spec, 0, {}))
        for key, spec in ((instruction.key, instruction.method), *instruction.batch)
    ]
    return attempt_each(steps)


@functools.cache
def _where() -> tuple[str, str]:
    """This process's host name and, when a Ray worker plays the client (Flower's simulation
    engine), its Ray node id (else ""): the same for every reply it sends."""
    ray = sys.modules.get("ray")
    node = str(ray.get_runtime_context().get_node_id()) if ray and ray.is_initialized() else ""
    return socket.gethostname(), node
