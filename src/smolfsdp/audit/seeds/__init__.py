"""The seeds' claims judged: what the two blog posts the book grew from say, held to evidence the package computes.

``claims`` (``judge_all``, the chapter's tables), its claims in ``claims_seed1`` / ``claims_seed2`` (settled
by the estimator and the installed libraries' source) and ``claims_runs`` (settled by a run), the shared
``Judgement`` and units in ``claims_core``; ``code`` (the seeds' code run as written on 2 gloo ranks, a
probe launched through ``smolfsdp.launch.probe``), ``installed_stack`` (the file and line of an installed
library's source that decides a behaviour). Chapter "What the seeds say, and what we measured".

    python -c "from smolfsdp.audit.seeds.claims import judge_all, summary_table; print(summary_table(judge_all()))"

Part of ``smolfsdp.audit``: it reuses the gotchas' tiny model and the step probe's units, and the dry run's grid.
"""
