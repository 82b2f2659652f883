"""The harness: everything that runs zoo entries on data and reports the results.

* :mod:`~bnn_zoo.harness.runs`: one entry fitted on one split, and the cache of runs;
* :mod:`~bnn_zoo.harness.provenance`: the code version and provenance every run names;
  :mod:`~bnn_zoo.harness.stale`: the cells of results that other code made;
* :mod:`~bnn_zoo.harness.compare`: many entries on many splits (the comparison);
* :mod:`~bnn_zoo.harness.summary`: mean, standard error, distances to a reference;
* :mod:`~bnn_zoo.harness.tables`: the one table writer (Markdown, CSV, JSON);
* :mod:`~bnn_zoo.harness.figures`: predictive bands, reliability diagrams, ELBO curves;
* :mod:`~bnn_zoo.harness.flags`: the command-line flags shared by the CLI and the
  benchmarks, and the one place that sets torch's thread count;
* :mod:`~bnn_zoo.harness.cli`, :mod:`~bnn_zoo.harness.prior_command`: the command line;
* :mod:`~bnn_zoo.harness.prior_diagnostics`, :mod:`~bnn_zoo.harness.prior_figures`,
  :mod:`~bnn_zoo.harness.published`: the prior study and the published UCI numbers.

Import the modules themselves (``from bnn_zoo.harness import compare``); the package
re-exports nothing.
"""

__all__: list[str] = []
