"""``python -m bnn_zoo``: see :mod:`bnn_zoo.cli`."""

from bnn_zoo.cli import main

raise SystemExit(main())
