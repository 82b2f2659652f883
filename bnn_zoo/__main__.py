"""``python -m bnn_zoo``: see `bnn_zoo.harness.cli`."""

from bnn_zoo.harness.cli import main

raise SystemExit(main())
