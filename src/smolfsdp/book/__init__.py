"""What the chapters show: chapter execution, tables, figures and the views of what the package measured.

``chapters`` (execute a chapter notebook, render the book), ``profiles`` (the smoke and full profiles),
``tables`` (tables shaped for a reader), ``figures/`` (every ``plot_*`` and ``save_figure``), ``fit_views``
(chapter 00's fit tables, from the one verdict ``smolfsdp.estimate.hardware.fit_verdict``), and the views:
``gotchas_view`` (the gotchas' results), ``probe_views`` (the step probe in sentences), ``drills_view``
(the drills' rows), ``fsdp_versions``, ``profiling``, ``scaling_views``, ``dryrun_views``, ``full_budget``
(the full profile's time). What the views read is made elsewhere: the gotchas in ``smolfsdp.gotchas``, the
chapters' probes in ``smolfsdp.probes``, the seeds' claims in ``smolfsdp.audit.seeds``, the GPU check in
``smolfsdp.audit.gpu_check``.

Layer: below ``smolfsdp.cli`` only; may import every other subpackage and the bottom modules. Nothing in
the package imports it: the chapters, scripts and tests do.
"""
