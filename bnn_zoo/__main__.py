"""``python -m bnn_zoo``: see `bnn_zoo._harness.cli`."""

from bnn_zoo._harness.cli import main

raise SystemExit(main())
