"""``oneshotfl flower ...``: the Flower app directory, development certificates and node
keys (a Flower run is compared with the local simulation by ``oneshotfl compare``).

Registered lazily by :mod:`oneshotfl.cli.main`; it imports no flwr itself (``cryptography`` comes
with the ``flower`` extra), so ``oneshotfl --help`` works without Flower installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from oneshotfl._version import __version__

app = typer.Typer(
    help="Run oneshotfl on Flower (needs the 'flower' extra: pip install 'oneshotfl\\[flower]').",
    no_args_is_help=True,
)

APP_PROJECT = """\
# The Flower app of oneshotfl, written by `oneshotfl flower app-dir`.
# Its components live in the installed oneshotfl package (every machine of the federation
# needs oneshotfl[flower] installed); start the SuperLink with
# --disable-runtime-dependency-installation.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "oneshotfl-flower"
version = "{version}"
description = "Any registered oneshotfl method, one message per client, on Flower"
license = "Apache-2.0"
dependencies = ["oneshotfl[flower]=={version}"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "oneshotfl"

[tool.flwr.app.components]
serverapp = "oneshotfl.flower.app:server_app"
clientapp = "oneshotfl.flower.app:client_app"

[tool.flwr.app.config]
# A YAML experiment config on the server ("" = defaults), then key=value overrides.
config = ""
overrides = ""
# The results directory on the server ("" = runs/flower-<timestamp>); absolute is safest.
out = ""
# Seconds to wait for `clients` nodes to connect, and for a node's reply (from the push).
node-timeout = 60.0
reply-timeout = 600.0
# The most instructions outstanding at once (0 = every node's at once).
in-flight = 0
# Ask each node for the round 0 of every method that needs no broadcast in one message (one
# ClientApp process per node, not one per method); false: one message per method and round.
batch-updates = true
# Flower's simulation engine only: the most clients one virtual node holds and answers for in
# one message (start ceil(clients / cohort-size) SuperNodes); 0 = one client per node.
cohort-size = 0
# The binding of node ids to client ids ("NODE=CLIENT ..."; "" = none): a node may only
# answer for its own client id (with SuperNode authentication, node ids are bound to keys).
node-clients = ""
# The folder of this machine's memory-mapped copy of the dataset ("" = $ONESHOTFL_SHARED_DATA
# or the temp folder; "off" = the ServerApp loads its own).
shared-data = ""
"""


def write_app_dir(out: Path) -> Path:
    """Write the Flower app project (``pyproject.toml``) into ``out``; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pyproject.toml"
    path.write_text(APP_PROJECT.format(version=__version__))
    return path


@app.command("app-dir")
def app_dir(
    out: Annotated[Path, typer.Argument(help="directory to write the Flower app into")],
) -> None:
    """Write the Flower app project that `flwr run DIR ...` submits."""
    path = write_app_dir(out)
    typer.echo(f"Flower app: {path}")


@app.command()
def certs(
    out: Annotated[Path, typer.Argument(help="directory for the certificates and keys")],
    nodes: Annotated[int, typer.Option(help="SuperNode key pairs to create")] = 3,
    host: Annotated[
        list[str] | None,
        typer.Option(help="SuperLink host name or IP (repeatable; default 127.0.0.1, localhost)"),
    ] = None,
) -> None:
    """Create development TLS certificates for the SuperLink and SuperNode auth keys."""
    try:
        from oneshotfl.flower.credentials import write_certificates, write_node_keys
    except ImportError as exc:
        typer.echo(f"error: {exc}; install the extra: pip install 'oneshotfl[flower]'", err=True)
        raise typer.Exit(2) from None
    try:
        paths = write_certificates(out, host or ["127.0.0.1", "localhost"])
        pairs = write_node_keys(out, nodes)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"CA certificate:      {paths['ca']}  (give to every SuperNode and flwr CLI)")
    typer.echo(f"SuperLink cert/key:  {paths['server_cert']}  {paths['server_key']}")
    for private, public in pairs:
        typer.echo(f"SuperNode key pair:  {private}  {public}")
