"""What the installed libraries do, read from them: the file and line of their source that decides a
behaviour (``smolfsdp.installed_source.source_line``), and what transformers' ``TrainingArguments`` makes of an ``fsdp_config``. The evidence of
the chapter "What the seeds say, and what we measured" (``smolfsdp.audit.seeds.claims``): when a pinned
version moves, these fail or change, and so does the page.

    python -c "from smolfsdp.installed_source import source_line as s; print(s('transformers.training_args', 'cpu_offload'))"
"""

from __future__ import annotations

import logging

from smolfsdp.installed_source import source_line  # noqa: F401  (the claims cite through it)


def trainer_fsdp_view(fsdp_config: dict, fsdp: bool | str = True) -> tuple[dict, list[str]]:
    """What transformers' ``TrainingArguments`` makes of ``fsdp_config``: the FSDP plugin arguments it hands
    to accelerate, and the warnings it logs. ``fsdp``: the ``fsdp`` argument (True, or a legacy string such as
    ``"full_shard auto_wrap"``). Runs the installed transformers (CPU, nothing launched)."""
    from transformers import TrainingArguments  # deferred: heavy; only the Trainer claims need it

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    log = logging.getLogger("transformers.training_args")
    handler = Keep(logging.WARNING)
    log.addHandler(handler)
    # the warnings are evidence, kept by ``Keep``; not propagating stops a second print into the chapter
    propagate, log.propagate = log.propagate, False
    filters, log.filters = log.filters, []  # smolfsdp.quiet's filter would drop the evidence; restored below
    try:
        args = TrainingArguments(output_dir="unused", fsdp=fsdp, fsdp_config=dict(fsdp_config), use_cpu=True,
                                 report_to="none")  # fmt: skip
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
        log.filters = filters
    return dict(args.fsdp_plugin_args or {}), seen
