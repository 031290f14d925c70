"""The book's helpers: chapter execution, figures, the FSDP gotchas, the drills, the mechanics recorder
and the GPU check and report.

``chapters`` (run a chapter notebook), ``plotting*`` (figures), ``gotchas`` (each FSDP pitfall, failing and
fixed), ``drills`` (kill-a-rank and resume drills), ``mechanics`` (what FSDP does in one step, recorded on
2 ranks), ``fsdp_versions`` / ``dtype_rule`` / ``scaling_views`` (chapter tables and checks), ``seed_claims``
(the seeds' claims judged; ``seed_code`` runs their code as written), ``gpu_check`` / ``gpu_report`` (the
measurements made on real GPUs).

Layer: below ``smolfsdp.cli`` only; may import every other subpackage (launch, train, checkpoint,
measure, sharding, traces, models, data) and the bottom modules. Nothing but the CLI imports it.
"""
