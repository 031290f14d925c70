"""The run options a TRL user expects, applied the same way in both engines: attention kernel, torch.compile,
Liger kernels; and what ``summary.json`` records of them.

* ``attn_implementation``: handed to transformers where the model is built (``models.modeling.build_model``, both
  engines); transformers may adjust it (flash-attention without ``flash-attn`` but with ``kernels`` becomes the
  Hub's kernel), so the record reads the one the model really uses, ``model.config._attn_implementation``.
* ``torch_compile``: the TRL engine passes ``TrainingArguments.torch_compile`` (accelerate compiles the wrapped
  model, :func:`trl_speedup_args`); the native engine compiles each decoder layer in place
  (:func:`apply_torch_compile`, torchtitan's per-block compile: one graph per repeated layer, and in place so
  parameter names, checkpoints and the export keep no ``_orig_mod``), after sharding.
* ``use_liger_kernel``: the TRL engine passes ``TrainingArguments.use_liger_kernel`` (TRL 1.16 keeps Liger's
  fused linear cross-entropy off, since it patches the LM head itself); the native engine applies the same
  kernels through the same call the Trainer makes (:func:`apply_liger`: transformers' ``apply_liger_kernel``,
  which dispatches to Liger's ``apply_liger_kernel_to_smollm3``: RoPE, RMSNorm, SwiGLU), the loss left to
  transformers as in the native loop without Liger.

Whether the machine has what each needs is checked before launch (``smolfsdp.launch.kernel_checks``).

    smolfsdp train --torch_compile true --max_steps 4 --name compiled     # native FSDP1, compiled layers, CPU
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from smolfsdp.models.modeling import decoder_layers

log = logging.getLogger(__name__)

#: Liger's kernels both engines apply (TRL 1.16 ``SFTTrainer.__init__`` turns the fused linear cross-entropy off:
#: it would replace the forward TRL patches with its fused LM head; the native loop keeps transformers' loss).
LIGER_CONFIG = {"fused_linear_cross_entropy": False, "cross_entropy": False}


def build_kwargs(cfg) -> dict[str, Any]:
    """``models.modeling.build_model``'s keywords for ``cfg``, the same in both engines: seed, remote code and
    ``attn_implementation``."""
    return {
        "seed": cfg.seed,
        "trust_remote_code": cfg.trust_remote_code,
        "attn_implementation": cfg.attn_implementation,
    }


def trl_speedup_args(cfg) -> dict[str, Any]:
    """The ``SFTConfig`` keywords of the run options: ``torch_compile``, ``use_liger_kernel`` and, with Liger,
    :data:`LIGER_CONFIG` (what TRL would set itself, stated)."""
    args: dict[str, Any] = {"torch_compile": cfg.torch_compile, "use_liger_kernel": cfg.use_liger_kernel}
    if cfg.use_liger_kernel:
        args["liger_kernel_config"] = dict(LIGER_CONFIG)
    return args


def compile_decoder_layers(model: nn.Module, wrap_cls: type[nn.Module]) -> int:
    """``torch.compile`` each decoder layer of ``model`` in place (``nn.Module.compile``); returns how many.

    In place, the module tree and its parameter names stay as they were (an ``OptimizedModule`` wrapper would add
    ``_orig_mod`` to every name). FSDP's own hooks stay outside the graphs (torch's ``skip_fsdp_hooks``); under
    activation checkpointing the checkpoint recomputes the compiled layer. The first step compiles (tens of
    seconds on a CPU), and a new sequence length recompiles once before the shapes are treated as dynamic."""
    layers = decoder_layers(model, wrap_cls)
    for layer in layers:
        layer.compile()
    return len(layers)


def apply_torch_compile(model: nn.Module, cfg, wrap_cls: type[nn.Module]) -> int | None:
    """The native engine's ``torch_compile``: :func:`compile_decoder_layers` on the sharded ``model`` when
    ``cfg.torch_compile``; returns how many, None when off. ``wrap_cls`` is resolved on the model before sharding
    (``models.modeling.resolve_wrap_class``): FSDP2 renames the classes it shards (``FSDPSmolLM3DecoderLayer``,
    a subclass). Called after ``native_sharding.shard_model``, so the full-size dry run, which shards the same
    way, never compiles."""
    if not cfg.torch_compile:
        return None
    return compile_decoder_layers(model, wrap_cls)


def apply_liger(model: nn.Module) -> nn.Module:
    """Liger's kernels on ``model`` in place, as the Trainer applies them with ``use_liger_kernel``
    (``transformers.integrations.liger.apply_liger_kernel`` with :data:`LIGER_CONFIG`). Raises ImportError
    without ``liger-kernel`` (the launcher refuses that first: ``smolfsdp.launch.kernel_checks``)."""
    from transformers.integrations.liger import apply_liger_kernel  # deferred: only runs asking for Liger

    apply_liger_kernel(model, dict(LIGER_CONFIG))
    return model


def run_options_record(
    cfg, model: nn.Module, compiled_layers: int | None = None, wrapped: nn.Module | None = None
) -> dict[str, Any]:
    """``summary.json``'s ``run_options``: each option as requested and as it ran. ``attn_implementation``'s
    ``effective`` is read from the model (``config._attn_implementation``: transformers' default ``sdpa`` when
    none was asked for, or what it fell back to); ``compiled_layers``: decoder layers the native engine compiled;
    ``compiled_model``: whether ``wrapped`` (the Trainer's ``model_wrapped``) is a compiled module, as accelerate
    makes it with ``torch_compile`` (``torch._dynamo``'s ``OptimizedModule``)."""
    from torch._dynamo.eval_frame import OptimizedModule  # deferred: torch._dynamo loads on first use

    config = getattr(model, "config", None)
    return {
        "attn_implementation": {
            "requested": cfg.attn_implementation,
            "effective": getattr(config, "_attn_implementation", None),
        },
        "torch_compile": {
            "requested": cfg.torch_compile,
            "compiled_layers": compiled_layers,
            "compiled_model": isinstance(wrapped, OptimizedModule),
        },
        "use_liger_kernel": cfg.use_liger_kernel,
    }
