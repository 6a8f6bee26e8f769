"""The command line: ``oneshotfl`` and its command groups (:mod:`oneshotfl.cli.main`), the
consoles, one-line user errors and printed tables (:mod:`oneshotfl.cli.support`), options
generated from config dataclasses and shared by commands (:mod:`oneshotfl.cli.options`), method
descriptions (:mod:`oneshotfl.cli.describe`) and the encoder research commands
(:mod:`oneshotfl.cli.encoders`). The top layer: nothing below imports it."""
