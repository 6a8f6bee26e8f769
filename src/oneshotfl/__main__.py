"""``python -m oneshotfl`` is the ``oneshotfl`` command."""

from oneshotfl._entry import main

main()
