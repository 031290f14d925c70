"""What the installed libraries do, read from them: the file and line of their source that decides a
behaviour, and what transformers' ``TrainingArguments`` makes of an ``fsdp_config``. The evidence of
the chapter "What the seeds say, and what we measured" (``smolfsdp.audit.seeds.claims``): when a pinned
version moves, these fail or change, and so does the page.

    python -c "from smolfsdp.audit.seeds.installed_stack import source_line as s; print(s('transformers.training_args', 'cpu_offload'))"
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path


def source_line(module: str, needle: str) -> str:
    """``package/file.py:LINE`` of the first line of the installed ``module`` that contains ``needle``.

    Raises LookupError when the text is gone (a different version is installed: re-check the claim)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"{module} is not installed")
    path = Path(spec.origin)
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            top = module.split(".")[0]
            rel = path.as_posix().split(f"/{top}/", 1)[-1]
            return f"{top}/{rel}:{number}"
    raise LookupError(f"{needle!r} not found in {path}: the installed {module} changed; re-check the claim")


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
