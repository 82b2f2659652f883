"""The harness: everything that runs zoo entries on data and reports the results.

* `runs`: one entry fitted on one split, and the cache of runs;
* `provenance`: the code version and provenance every run names;
  `stale`: the cells of results that other code made;
* `compare`: many entries on many splits (the comparison);
* `summary`: mean, standard error, distances to a reference;
* `tables`: the one table writer (Markdown, CSV, JSON);
* `figures`: predictive bands, reliability diagrams, ELBO curves;
* `flags`: the command-line flags shared by the CLI and the
  benchmarks, and the one place that sets torch's thread count;
* `cli`, `prior_command`: the command line;
* `prior_diagnostics`, `prior_figures`,
  `published`: the prior study and the published UCI numbers.

Import the modules themselves (``from bnn_zoo._harness import compare``); the package
re-exports nothing.
"""

__all__: list[str] = []
