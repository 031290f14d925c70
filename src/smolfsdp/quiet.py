"""The third-party warnings a smolfsdp run prints, each filtered here with why it is harmless.

One place for every known warning of the pinned stack (torch 2.13, transformers 5.24, trl 1.16,
accelerate 1.15, peft 0.21) that a learner would otherwise read on each run without being able to act
on it. :func:`install` adds one narrow filter per entry of :data:`KNOWN`: the exact message (a regex
anchored at the start), the logger or warning category and module that emit it. Anything else, our
own warnings and a truncation notice included, still prints. The CLI and every launched process
(``sft.train``) call :func:`install` first; ``launch.runner.preflight`` too (it builds the LoRA model in the
caller's process).

Warnings fixed at their cause instead (nothing filtered):

* peft ``Unable to fetch remote file ... config.json in tiny`` and ``Could not find a config file in
  tiny`` at adapter save: ``lora_fsdp2.save_adapter`` passes ``save_embedding_layers`` explicitly, so
  peft does not look the base model up on the Hub.
* accelerate ``The used dataset had no length`` (INFO, once per eval batch): ``distributed.setup_logging``
  shows INFO from ``smolfsdp`` loggers only; third-party loggers print from WARNING up.
* torch DDP ``find_unused_parameters=True was specified ... but did not find any unused parameters``
  (TRL with ``accelerate_fsdp_on_cpu: false``): ``trl_engine.trl_args`` sets ``ddp_find_unused_parameters=False``
  (every parameter of the causal LM gets a gradient).
* transformers ``Token indices sequence length is longer than the specified maximum sequence length ...
  will result in indexing errors`` (once per tokenizer: in the launcher and on each rank) for a row longer
  than the tokenizer's ``model_max_length``: ``data.chat.render_ids`` tokenizes with ``verbose=False``,
  since such a row never reaches the model (``data.prepare`` drops or cuts it at ``max_length`` and logs
  how many rows and why, once, on rank 0).
* The Trainer's raw log dict per logging step: ``trl_callbacks.OneLineProgressCallback`` prints one
  readable line on rank 0 instead.
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    """A third-party warning we filter. ``logger``: the ``logging`` logger that emits it, or None for a
    ``warnings.warn`` of ``category`` from ``module`` (a regex on the module name)."""

    message: str  # regex, matched at the start of the message
    library: str  # library and version that emits it, and where
    why: str  # why a smolfsdp user can ignore it here
    logger: str | None = None
    category: type[Warning] = UserWarning
    module: str = ""


KNOWN: tuple[Known, ...] = (
    Known(
        message=r"`is_gradient_checkpointing` is deprecated and will be removed in v6",
        library="transformers 5.24 (modeling_utils.PreTrainedModel.is_gradient_checkpointing), read by "
        "peft 0.21 PeftModel.__init__ (peft_model.py) on every get_peft_model",
        why="peft reads the deprecated alias; its value equals is_activation_checkpointing, and the call "
        "is in peft, not in smolfsdp, so there is nothing for a user to change",
        category=FutureWarning,
        module=r"transformers\.modeling_utils",
    ),
    Known(
        message=r"FSDP1 \(`fsdp_config\['version'\] = 1`\) is deprecated",
        library="transformers 5.24 (training_args.TrainingArguments._process_fsdp_args), once per rank",
        why="a real fact that the book keeps: trl_engine.run_trl says it once, on rank 0, in its own words "
        "(transformers' text names v5.20 as the removal while 5.24, which still runs it, is pinned)",
        logger="transformers.training_args",
    ),
    Known(
        message=r"sharding_strategy is deprecated in favor of reshard_after_forward\. "
        r"This will be removed in a future version of Accelerate\.$",
        library="accelerate 1.15 (utils.dataclasses.FullyShardedDataParallelPlugin.__post_init__), once per rank",
        why="smolfsdp.sharding.fsdp1.pin_plugin_sharding_strategy sets the deprecated field on purpose: without it "
        "accelerate 1.15 wraps FULL_SHARD whatever fsdp_config asks. Only this exact message is dropped; "
        "accelerate's other FSDP2-conversion warnings still print",
        logger="accelerate.utils.dataclasses",
    ),
    Known(
        message=r"Called FSDP\.clip_grad_norm_\(\) on rank \S+ with no gradients",
        library="torch 2.13 (distributed.fsdp.FullyShardedDataParallel.clip_grad_norm_, attributed to the "
        "torch.utils._contextlib frame of its no_grad decorator), once per rank process",
        why="FSDP1 + LoRA (use_orig_params): a rank whose FlatParameter shards hold no adapter element has "
        "no local gradient, so torch warns; the norm it returns is still the global one (the local sums are "
        "all-reduced before the warning), only in fp32, which smolfsdp.train.steps.clip_grad_norm reads anyway",
        module=r"torch\.utils\._contextlib",
    ),
    Known(
        message=r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to load "
        r"in a single process",
        library="torch 2.13 (distributed.checkpoint.state_dict_loader.load), on every dcp.load without a "
        "process group, no_dist=True included",
        why="`smolfsdp convert` loads a sharded checkpoint in one process on purpose (DCP reads every shard "
        "there); inside a launched run the process group always exists, so it cannot hide a missing one",
        module=r"torch\.distributed\.checkpoint",
    ),
)


class _DropKnown(logging.Filter):
    """Drops records whose message matches one of ``patterns`` (attached to one logger)."""

    def __init__(self, patterns: list[str]):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(p.match(msg) for p in self.patterns)


def install() -> None:
    """Add the filters of :data:`KNOWN` to this process (idempotent; cheap: imports nothing heavy)."""
    by_logger: dict[str, list[str]] = {}
    for k in KNOWN:
        if k.logger is None:
            warnings.filterwarnings("ignore", message=k.message, category=k.category, module=k.module)
        else:
            by_logger.setdefault(k.logger, []).append(k.message)
    for name, patterns in by_logger.items():
        lg = logging.getLogger(name)
        for f in [f for f in lg.filters if isinstance(f, _DropKnown)]:
            lg.removeFilter(f)
        lg.addFilter(_DropKnown(patterns))


def is_known(message: str) -> bool:
    """Whether ``message`` is one of the filtered warnings (for tests and ``--verbose`` readers)."""
    return any(re.match(k.message, message) for k in KNOWN)


# ------------------------------------------------------------------------------ what counts as a warning line
#: A line that reads as a warning: ``Warning``, ``FutureWarning``, ``warnings.warn(``, ``deprecated``, ...
WARNING_WORDS = re.compile(r"warn|deprecat", re.IGNORECASE)
#: smolfsdp's own lines: the launcher's ``[smolfsdp] ...`` and a rank's ``[rank0] 09:10:08 smolfsdp.data.prepare: ...``
OWN = re.compile(r"^(\[smolfsdp\]|\[rank\d+\] [\d:]+ smolfsdp[.\w]*:)")


def is_third_party_warning(line: str) -> bool:
    """Whether one line of a run's output looks like a warning and was not printed by smolfsdp (:data:`OWN`)."""
    return bool(WARNING_WORDS.search(line)) and not OWN.match(line.strip())


def third_party_warning_lines(log: str) -> list[str]:
    """Lines of a run's output that look like a warning and were not printed by smolfsdp: what a newcomer's
    run must not show (tests/test_quiet.py), and what ``launch.progress.rank0_progress`` keeps off a page."""
    return [ln for ln in log.splitlines() if is_third_party_warning(ln)]
