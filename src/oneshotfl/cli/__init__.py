"""The command line: ``oneshotfl`` and its command groups (:mod:`oneshotfl.cli.main`), the
consoles, one-line user errors and shared options (:mod:`oneshotfl.cli.support`), method
descriptions (:mod:`oneshotfl.cli.describe`) and the encoder research commands
(:mod:`oneshotfl.cli.encoders`). The top layer: nothing below imports it."""
