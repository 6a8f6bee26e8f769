"""The ``oneshotfl`` console entry point: ``--version`` and the ``flower`` commands (the app
directory, certificates and node keys) answer without importing torch or the other command
modules (a second, not the several the full command takes to load: the Flower scripts call
them on every deployment); everything else runs :data:`oneshotfl.cli.app`."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``oneshotfl`` command."""
    if sys.argv[1:] == ["--version"]:
        from oneshotfl._version import __version__

        print(f"oneshotfl {__version__}")
        return
    if sys.argv[1:2] == ["flower"]:
        from oneshotfl.flower.cli import app as flower_app

        flower_app(args=sys.argv[2:], prog_name="oneshotfl flower")
        return
    from oneshotfl.cli.main import app

    app()
