"""The project's own numbers judged: where the estimator, the book and the seeds are held to evidence.

Nothing a learner runs lives here; the teaching code is in ``sharding``, ``train``, ``checkpoint`` and
``estimate``. This is torchtitan's ``experiments/`` fence for the checks:

* ``dryrun/``: the full-size dry run (the real 3B model through the package's code on fake tensors) and the
  estimator held to it (``compare``), with the published runs it replays (``published_replay``);
* ``allocator_replay``: PyTorch's CUDA caching allocator in Python, replayed on a dry run's allocation order;
* ``published_rows``: the estimator against numbers other projects published (``data/results/published/``),
  FSDP1's ``record_stream`` blocks against the one published FSDP1/FSDP2 pair included;
* ``hfu_fit``: the step-time rate fitted to those rows (``scripts/published_check.py`` writes it where
  ``smolfsdp.estimate.calibration`` reads it);
* ``gpu_check/``: the one-GPU measurement and its report;
* ``seeds/``: the two seed texts' claims judged (chapter "What the seeds say, and what we measured").

The book shows these in its appendix "How the estimates are checked" and in the seeds' chapter.

Layer: below ``book`` and the CLI, above ``gotchas`` and ``probes`` (the seeds' checks reuse their tiny model and
units) and every layer below them.
"""
