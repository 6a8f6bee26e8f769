"""``python -m oneshotfl`` is the ``oneshotfl`` command."""

from oneshotfl.cli import app

app()
