"""FSDP1: ``FullyShardedDataParallel`` wrapping (native engine) and the Trainer's ``fsdp_config``.

FSDP1 flattens every wrapped unit's parameters into one ``FlatParameter`` and shards that 1-D
tensor evenly across ranks (padding the last shard). Used by the fine-tune and FSDP1-vs-FSDP2
chapters.

    torchrun --nproc-per-node 2 -m smolfsdp.cli train --engine native --fsdp_version 1
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    FullyShardedDataParallel,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from smolfsdp.config import ConfigError, nearest

#: The keys transformers 5.24's ``TrainingArguments._process_fsdp_args`` reads from ``fsdp_config``
#: (src/transformers/training_args.py). Anything else is silently ignored there, so we refuse it.
HF_FSDP_CONFIG_KEYS = frozenset(
    {
        "version",
        "min_num_params",
        "transformer_layer_cls_to_wrap",
        "auto_wrap_policy",
        "backward_prefetch",
        "forward_prefetch",
        "state_dict_type",
        "cpu_offload",
        "cpu_ram_efficient_loading",
        "activation_checkpointing",
        "reshard_after_forward",
        "use_orig_params",
        "sync_module_states",
        "limit_all_gathers",
        "xla",
        "xla_fsdp_v2",
        "xla_fsdp_grad_ckpt",
        "xla_fsdp_settings",
    }
)


def wrap_fsdp1(
    model: nn.Module,
    wrap_cls: type[nn.Module],
    *,
    device: torch.device | None = None,
    sharding_strategy: str = "FULL_SHARD",
    backward_prefetch: str = "BACKWARD_PRE",
    cpu_offload: bool = False,
    param_dtype: torch.dtype | None = None,
    use_orig_params: bool = True,
    sync_module_states: bool = False,
) -> FullyShardedDataParallel:
    """Wrap ``model`` with FSDP1: one unit per ``wrap_cls`` module (transformer auto-wrap) plus the root.

    Args:
        device: the rank's CUDA device (FSDP moves each unit there), or None/CPU for gloo runs.
        sharding_strategy: a ``ShardingStrategy`` name (FULL_SHARD = ZeRO-3).
        backward_prefetch: ``BACKWARD_PRE`` all-gathers the next unit's parameters before the current
            unit's gradient computation, ``BACKWARD_POST`` after it, ``NO_PREFETCH`` never early.
        param_dtype: compute dtype (e.g. ``torch.bfloat16``); gradients are reduced in fp32.
        use_orig_params: keep the original ``nn.Parameter`` objects as views into the FlatParameter
            (needed to freeze single parameters, e.g. for LoRA, and for per-parameter optimizer groups).
    """
    mp = None
    if param_dtype is not None:
        mp = MixedPrecision(param_dtype=param_dtype, reduce_dtype=torch.float32, buffer_dtype=param_dtype)
    on_cuda = device is not None and device.type == "cuda"
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={wrap_cls}),
        sharding_strategy=ShardingStrategy[sharding_strategy],
        backward_prefetch=None if backward_prefetch == "NO_PREFETCH" else BackwardPrefetch[backward_prefetch],
        cpu_offload=CPUOffload(offload_params=cpu_offload),
        mixed_precision=mp,
        # On CPU, FSDP1 must be told so: with device_id=None it looks for an accelerator and raises.
        device_id=device if device is not None else torch.device("cpu"),
        use_orig_params=use_orig_params,
        sync_module_states=sync_module_states and on_cuda,
    )


def fsdp_units(model: nn.Module) -> list[FullyShardedDataParallel]:
    return list(FullyShardedDataParallel.fsdp_modules(model))


def local_numel(model: nn.Module) -> int:
    """Elements of the FlatParameter shards this rank holds (padding included)."""
    return sum(
        u._flat_param.numel() for u in fsdp_units(model) if getattr(u, "_flat_param", None) is not None
    )


def check_hf_fsdp_config(fsdp_config: dict[str, Any]) -> dict[str, Any]:
    """Return a validated copy of a Trainer ``fsdp_config``; the caller's dict is never changed.

    Accepts keys with or without the ``fsdp_`` prefix (as transformers does) and returns them without it.

    Raises:
        ConfigError: an unknown key, naming the nearest valid key.
    """
    out: dict[str, Any] = {}
    for key, value in dict(fsdp_config).items():
        bare = key[5:] if key.startswith("fsdp_") else key
        if bare not in HF_FSDP_CONFIG_KEYS:
            hint = nearest(bare, HF_FSDP_CONFIG_KEYS)
            raise ConfigError(
                f"Unknown FSDP config key {key!r}"
                + (f"; did you mean {hint[0]!r}?" if hint else ".")
                + f" Valid keys: {', '.join(sorted(HF_FSDP_CONFIG_KEYS))}."
            )
        out[bare] = list(value) if isinstance(value, list) else value
    return out


def hf_fsdp_config(
    version: int = 1,
    wrap_class: str = "SmolLM3DecoderLayer",
    *,
    backward_prefetch: str = "BACKWARD_PRE",
    state_dict_type: str = "SHARDED_STATE_DICT",
    cpu_offload: bool = False,
    activation_checkpointing: bool = False,
    sync_module_states: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``fsdp_config`` the Trainer receives (``TrainingArguments(fsdp=True, fsdp_config=...)``).

    These are the seed run's settings: full shard, transformer auto-wrap at ``wrap_class``, backward
    prefetch, sharded state dict, optional CPU offload. transformers 5.x defaults to FSDP2, so FSDP1
    needs ``version: 1`` (and warns that FSDP1 is deprecated). Activation checkpointing goes through
    FSDP here, not through ``gradient_checkpointing``: transformers warns that the latter adds a
    redundant all-gather (its issue #30404); on our CPU runs we did not measure one (gotcha 6).
    """
    cfg: dict[str, Any] = {
        "version": int(version),
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": [wrap_class],
        "state_dict_type": state_dict_type,
        "cpu_offload": bool(cpu_offload),
        "activation_checkpointing": bool(activation_checkpointing),
    }
    if int(version) == 1:
        cfg.update(
            {
                "reshard_after_forward": "full_shard",
                "backward_prefetch": backward_prefetch,
                "use_orig_params": True,
                "sync_module_states": bool(sync_module_states),
            }
        )
    else:
        cfg["reshard_after_forward"] = True
    cfg.update(extra or {})
    return check_hf_fsdp_config(cfg)
