"""The one-GPU check and its report: SmolLM3-3B's geometry measured on one real GPU, beside the estimates.

``measure_gpu`` (the measurement: memory by component, step time, a profiled window, with provenance), ``profiled_window``
(what the profiled window shows: NCCL kernels, busy fraction, per-layer FSDP ranges; ``analyze-trace``
run on it), ``report`` (the committed results in ``data/results/`` as the chapters show them).
``scripts/gpu_check.py`` runs the check; the appendix "How the estimates are checked" and chapter "Reading
the profiler"
read the report.

    PYTHONPATH=src python3 scripts/gpu_check.py --simulate-cpu --out /tmp/sim

Part of ``smolfsdp.audit``; imports ``measure``, ``estimate``, ``sharding``, ``models``, ``traces``.
"""
