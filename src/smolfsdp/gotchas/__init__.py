"""The gotchas: the seams where FSDP, the Trainer and their neighbours fail, each reproduced and then fixed.

``registry`` (the catalogue: names, titles, how each runs, explanations; no torch, so ``smolfsdp gotchas
--list`` is quick), ``runner`` (``run_gotchas``: one launch of 2 gloo ranks for the distributed cases,
subprocesses for the rest; ``main`` is ``smolfsdp gotchas``), ``cases_distributed`` / ``cases_local`` (each
gotcha's failing and fixed form), ``cases_reported`` / ``cases_collectives`` (problems users reported upstream,
``registry.REPORTED``), ``explained`` (the reported problems that need a GPU: what happens, the fix, the installed
source lines and the threads), ``builders`` (the tiny SmolLM3, a batch per rank, FSDP2 on a CPU mesh).
The chapter "Debugging the seams" shows the results through ``smolfsdp.book.gotchas_view``.

    smolfsdp gotchas --list
    smolfsdp gotchas --run tied_embeddings --json

Layer: beside ``probes`` and ``gpu_check`` (none imports another), below ``seeds``, ``book`` and the CLI;
may import ``launch`` (the probes' launcher, ``launch.probe``) and every layer below it.
"""
