"""FSDP1 with each LoRA adapter its own unit (``lora_layout: adapter-units``), as fsdp_qlora and llama-recipes wrap.

AnswerDotAI/fsdp_qlora ``train.py`` (``get_wrapping_policy``) and llama-recipes (``fsdp_auto_wrap_policy``) pass
FSDP1 an ``_or_policy`` of two policies (``torch.distributed.fsdp.wrap``):

* a ``lambda_auto_wrap_policy`` that wraps every leaf module whose ``weight`` requires a gradient: with peft,
  each ``lora_A.default`` / ``lora_B.default`` ``Linear``, so each adapter matrix is its own small FlatParameter;
* the ``transformer_auto_wrap_policy`` on the decoder-layer class, as smolfsdp's own wrap.

FSDP1 wraps bottom-up, so the adapters become units first and the decoder layer's FlatParameter then holds
only frozen weights: ``requires_grad`` false, no gradient, no reduce-scatter for it
(``FlatParamHandle._init_flat_param_and_metadata``: a FlatParameter requires a gradient if any of its
parameters does). The in-unit layout (the default) puts the adapters in that FlatParameter, so FSDP1 gives
the frozen base a gradient too (``smolfsdp.estimate.layout.sharded_state`` counts both).

    python -c "from smolfsdp.sharding.adapter_units import adapter_units_policy as p; print(p(object))"
"""

from __future__ import annotations

import dataclasses
import functools

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy


def is_trainable_leaf(module: nn.Module) -> bool:
    """fsdp_qlora's ``lambda_policy_fn``: a module without children whose ``weight`` requires a gradient."""
    weight = getattr(module, "weight", None)
    return not list(module.children()) and isinstance(weight, nn.Parameter) and weight.requires_grad


def adapter_units_policy(wrap_cls: type[nn.Module]):
    """The ``auto_wrap_policy`` for ``FullyShardedDataParallel``: each trainable leaf (LoRA A or B) its own
    unit, or-ed with a unit per ``wrap_cls`` module."""
    return functools.partial(
        _or_policy,
        policies=[
            functools.partial(lambda_auto_wrap_policy, lambda_fn=is_trainable_leaf),
            functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={wrap_cls}),
        ],
    )


def adapter_units_mixed_precision(mp: MixedPrecision | None) -> MixedPrecision | None:
    """``mp`` with ``cast_forward_inputs=True`` (as fsdp_qlora's ``train.py`` sets it); None stays None.

    Why: peft's ``lora.Linear.forward`` casts its input to ``lora_A.weight.dtype`` *before* calling
    ``lora_A`` (``peft/tuners/lora/layer.py``, ``_cast_input_dtype``). With the adapter its own unit that
    weight is still the fp32 shard view at that moment (the unit gathers it in bf16 in its own pre-forward),
    so a bf16 run would hand the bf16 weight an fp32 input ("expected m1 and m2 to have the same dtype").
    Casting each unit's forward inputs to ``param_dtype`` puts them back in bf16."""
    return None if mp is None else dataclasses.replace(mp, cast_forward_inputs=True)


def unit_summary(model: nn.Module) -> dict[str, int]:
    """Count the FSDP1 units of ``model`` (the root included) by what their FlatParameter holds: ``trainable``
    (requires a gradient) and ``frozen``; ``units`` = both. Units without parameters are left out."""
    out = {"units": 0, "trainable": 0, "frozen": 0}
    for unit in FullyShardedDataParallel.fsdp_modules(model):
        flat = getattr(unit, "_flat_param", None)
        if flat is None:
            continue
        out["units"] += 1
        out["trainable" if flat.requires_grad else "frozen"] += 1
    return out
