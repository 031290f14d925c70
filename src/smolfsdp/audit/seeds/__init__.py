"""The seeds' claims judged: what the two blog posts the book grew from say, held to evidence the package computes.

``claims`` (``judge_all``, the chapter's tables and its order, :data:`claims.INVENTORY`); the claims by subject in
``memory_claims``, ``trainer_claims``, ``step_claims`` and ``fsdp2_claims``, each a function returning a
``judgement.Judgement``; ``seed_code`` (the seeds' code run as written on 2 gloo ranks, a probe launched through
``smolfsdp.launch.probe``), ``installed_stack`` (the file and line of an installed library's source that decides a
behaviour). Chapter "What the seeds say, and what we measured".

    python -c "from smolfsdp.audit.seeds.claims import judge_all, summary_table; print(summary_table(judge_all()))"

Part of ``smolfsdp.audit``: it reuses the gotchas' tiny model and the step probe's units, and the dry run's grid.
"""
