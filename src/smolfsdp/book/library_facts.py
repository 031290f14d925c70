"""What the installed libraries do where a chapter explains them, each sentence citing the line that decides it.

Chapter "FSDP mechanics" prints these paragraphs: who accumulates gradients under ``no_sync`` (transformers'
Trainer, accelerate, and smolfsdp's TRL engine) and how FSDP2 prefetches its all-gathers in forward and in
backward. Each cites ``package/file.py:LINE`` found by :func:`smolfsdp.audit.seeds.installed_stack.source_line` in
the installed version, so when a pinned library changes the text these sentences rest on, the chapter stops
with LookupError instead of teaching what the library no longer does (``tests/test_library_facts.py`` also
holds the behaviour itself: the plugin's default, the Trainer's loop, torch's hooks).

    python -c "from smolfsdp.book.library_facts import accumulation_markdown as f; print(f())"
"""

from __future__ import annotations

from accelerate.utils import GradientAccumulationPlugin

from smolfsdp.audit.seeds.installed_stack import source_line

#: (module, text of the line) for each claim of :func:`accumulation_markdown`
ACCUMULATION_LINES = {
    "trainer sync test": ("transformers.trainer", 'plugin_kwargs.get("sync_each_batch", False)'),
    "trainer no_sync": ("transformers.trainer", "functools.partial(self.accelerator.no_sync, model=model)"),
    "plugin default": ("accelerate.utils.dataclasses", "sync_each_batch: bool = field("),
    "accelerate FSDP2": ("accelerate.accelerator", "model.set_requires_gradient_sync(False)"),
    "accelerate FSDP1": ("accelerate.accelerator", 'context = getattr(model, "no_sync", context)'),
    "smolfsdp sets": ("smolfsdp.train.trl_engine", '{"sync_each_batch": True}'),
    "smolfsdp offload": ("smolfsdp.train.trl_engine", "def accumulates_under_no_sync"),
}

_FSDP2 = "torch.distributed.fsdp._fully_shard"
#: (module, text of the line) for each claim of :func:`prefetch_markdown`
PREFETCH_LINES = {
    "implicit forward": (f"{_FSDP2}._fsdp_param_group", "For implicit forward prefetching"),
    "separate streams": (f"{_FSDP2}._fsdp_param_group", "# Use separate streams for implicit prefetching"),
    "explicit backward order": (f"{_FSDP2}._fsdp_param_group", "# Post-forward order for explicit backward"),
    "backward prefetch": (f"{_FSDP2}._fsdp_param_group", "def _backward_prefetch(self)"),
    "default unless set": (
        f"{_FSDP2}._fsdp_state",
        "default_prefetch = len(self._states_to_backward_prefetch) == 0",
    ),
    "forward setter": (f"{_FSDP2}._fully_shard", "def set_modules_to_forward_prefetch"),
    "backward setter": (f"{_FSDP2}._fully_shard", "def set_modules_to_backward_prefetch"),
}


def cite(lines: dict[str, tuple[str, str]]) -> dict[str, str]:
    """``{claim: "package/file.py:LINE"}`` for ``{claim: (module, text)}``; LookupError when a text is gone."""
    return {claim: source_line(module, text) for claim, (module, text) in lines.items()}


def _code(ref: str) -> str:
    return f"`{ref}`"


def accumulation_markdown() -> str:
    """Who skips the gradient reduction under gradient accumulation, as installed: transformers' Trainer runs
    every micro-batch but the last under ``accelerator.no_sync(model)`` unless
    ``GradientAccumulationPlugin.sync_each_batch`` is set (its default is read from accelerate, not typed); for
    FSDP accelerate's ``no_sync`` is FSDP1's ``model.no_sync()`` or FSDP2's ``set_requires_gradient_sync(False)``;
    smolfsdp's TRL engine sets ``sync_each_batch=True`` except under FSDP1 CPU offload, and its native loop
    never skips a reduction. Raises LookupError when a cited line is gone from the installed version."""
    ref = {k: _code(v) for k, v in cite(ACCUMULATION_LINES).items()}
    default = GradientAccumulationPlugin().sync_each_batch
    if default:  # accelerate changed its default: the paragraph below would be wrong
        raise LookupError(
            "accelerate's GradientAccumulationPlugin now defaults sync_each_batch=True; re-check chapter 02"
        )
    return (
        "Which one runs is not FSDP's choice but the training loop's. transformers' Trainer runs every micro-batch "
        "but the last under `accelerator.no_sync(model)` unless `sync_each_batch` is set "
        f"({ref['trainer sync test']}, {ref['trainer no_sync']}), and accelerate's `GradientAccumulationPlugin` "
        f"leaves it `{default}` ({ref['plugin default']}). For an FSDP model accelerate's `no_sync` is FSDP2's "
        f"`set_requires_gradient_sync(False)` ({ref['accelerate FSDP2']}) or FSDP1's `model.no_sync()` "
        f"({ref['accelerate FSDP1']}). So a Trainer left at its defaults accumulates every FSDP run's gradients "
        "unsharded: the `once per step (no_sync)` row. smolfsdp's TRL engine asks for `sync_each_batch=True` "
        f"({ref['smolfsdp sets']}), the `every micro-batch` row, except for FSDP1 with CPU offload, which torch "
        f"supports only inside `no_sync()` ({ref['smolfsdp offload']}); its native loop never skips a reduction. "
        "The memory estimate follows what each engine runs."
    )


def prefetch_markdown() -> str:
    """How FSDP2 (torch's ``fully_shard``) overlaps its all-gathers by default, in torch's own words: forward
    prefetching is *implicit* (each unit's all-gather issued by its own pre-forward hook, on a separate
    all-gather stream), backward prefetching *explicit* and on by default (each unit's pre-backward hook issues
    the previous unit's all-gather, by the recorded reverse forward order), and what the two
    ``set_modules_to_*_prefetch`` methods change. Raises LookupError when a cited line is gone."""
    ref = {k: _code(v.rsplit("/", 1)[-1]) for k, v in cite(PREFETCH_LINES).items()}  # all in one folder
    return (
        "FSDP2 overlaps its all-gathers in both passes by default, in two different ways, which torch's source "
        "(`torch/distributed/fsdp/_fully_shard/`) names. **Forward prefetching is implicit** "
        f"({ref['implicit forward']}): a layer's all-gather is issued by that layer's own pre-forward hook, "
        f"on an all-gather stream separate from the compute stream ({ref['separate streams']}). Nothing is "
        "requested early; on a GPU the CPU runs ahead of the kernels it queues, so layer *i+1*'s all-gather is "
        "issued, and runs, while layer *i* still computes. **Backward prefetching is explicit, and on by "
        f"default**: FSDP2 records the order in which units finished their forward ({ref['explicit backward order']}), "
        "and each unit's pre-backward hook issues the all-gather of the unit before it in that order "
        f"(`FSDPParamGroup._backward_prefetch`, {ref['backward prefetch']}; `FSDP::backward_prefetch` in the "
        f"trace) unless `set_modules_to_backward_prefetch` named others ({ref['default unless set']}). "
        f"`set_modules_to_forward_prefetch([next layer])` ({ref['forward setter']}) makes forward explicit too: "
        "a layer issues the next one's all-gather right after its own, earlier from the CPU; "
        f"`set_modules_to_backward_prefetch` ({ref['backward setter']}) replaces the default order. A list of "
        "two or more modules prefetches deeper and holds more gathered layers at once. The probe's fourth "
        "variant sets both, one layer ahead."
    )
