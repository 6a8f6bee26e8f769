"""The ``oneshotfl`` console entry point: ``--version`` answers without importing torch or
the command modules (a second, not the several the full command takes to load); everything
else runs :data:`oneshotfl.cli.app`."""

from __future__ import annotations

import sys


def main() -> None:
    """Run the ``oneshotfl`` command."""
    if sys.argv[1:] == ["--version"]:
        from oneshotfl._version import __version__

        print(f"oneshotfl {__version__}")
        return
    from oneshotfl.cli.main import app

    app()
