"""FSDP1: ``FullyShardedDataParallel`` wrapping (native engine) and the Trainer's ``fsdp_config``.

FSDP1 flattens every wrapped unit's parameters into one ``FlatParameter`` and shards that 1-D
tensor evenly across ranks (padding the last shard). ``HYBRID_SHARD`` shards it within a group and
replicates it across groups (gradients: reduce-scatter in the group, then all-reduce across). Used
by the fine-tune, FSDP1-vs-FSDP2 and multi-node chapters.

    torchrun --nproc-per-node 2 -m smolfsdp.cli train --engine native --fsdp_version 1
    torchrun --nproc-per-node 4 -m smolfsdp.cli train --nproc 4 --sharding_strategy HYBRID_SHARD --replicate_size 2
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

from smolfsdp.errors import ConfigError, did_you_mean
from smolfsdp.sharding.adapter_units import adapter_units_mixed_precision, adapter_units_policy
from smolfsdp.sharding.fsdp2 import SHARDING_STRATEGIES

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
    device_mesh=None,
    backward_prefetch: str = "BACKWARD_PRE",
    cpu_offload: bool = False,
    param_dtype: torch.dtype | None = None,
    use_orig_params: bool = True,
    sync_module_states: bool = False,
    lora_layout: str = "in-unit",
) -> FullyShardedDataParallel:
    """Wrap ``model`` with FSDP1: one unit per ``wrap_cls`` module (transformer auto-wrap) plus the root.

    Args:
        device: the rank's CUDA device (FSDP moves each unit there), or None/CPU for gloo runs.
        sharding_strategy: a ``ShardingStrategy`` name: FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2),
            NO_SHARD (DDP), HYBRID_SHARD (FULL_SHARD within a group, replicas across groups).
        device_mesh: for HYBRID_SHARD, a 2-D ``DeviceMesh`` (replicate dim first, shard dim second;
            ``smolfsdp.sharding.fsdp2.build_mesh(..., replicate_size=R)``). Without one, torch shards over
            ``device_count()`` ranks per node (torch/distributed/fsdp/_init_utils.py), which is 1 on a
            CPU (``torch.cpu.device_count()``): no sharding at all, so a mesh is required here.
        backward_prefetch: ``BACKWARD_PRE`` all-gathers the next unit's parameters before the current
            unit's gradient computation, ``BACKWARD_POST`` after it, ``NO_PREFETCH`` never early.
        param_dtype: compute dtype (e.g. ``torch.bfloat16``); gradients are reduced in fp32 and buffers
            stay fp32 (:func:`mixed_precision_policy`).
        use_orig_params: keep the original ``nn.Parameter`` objects as views into the FlatParameter
            (needed to freeze single parameters, e.g. for LoRA, and for per-parameter optimizer groups).
        lora_layout: ``in-unit`` (adapters inside their layer's unit) or ``adapter-units`` (each trainable leaf
            its own unit: ``smolfsdp.sharding.adapter_units``; ``smolfsdp.lora_options`` says why).
    Raises ConfigError for an unknown strategy, or HYBRID_SHARD without a 2-D mesh (:func:`check_fsdp1_strategy`).
    """
    check_fsdp1_strategy(sharding_strategy, device_mesh)
    mp = mixed_precision_policy(param_dtype)
    on_cuda = device is not None and device.type == "cuda"
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={wrap_cls})
    if lora_layout == "adapter-units":
        policy = adapter_units_policy(wrap_cls)
        mp = adapter_units_mixed_precision(mp)
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=policy,
        sharding_strategy=ShardingStrategy[sharding_strategy],
        device_mesh=device_mesh,
        backward_prefetch=None if backward_prefetch == "NO_PREFETCH" else BackwardPrefetch[backward_prefetch],
        cpu_offload=CPUOffload(offload_params=cpu_offload),
        mixed_precision=mp,
        # On CPU, FSDP1 must be told so: with device_id=None it looks for an accelerator and raises.
        device_id=device if device is not None else torch.device("cpu"),
        use_orig_params=use_orig_params,
        sync_module_states=sync_module_states and on_cuda,
    )


def check_fsdp1_strategy(sharding_strategy: str, device_mesh=None) -> None:
    """Raise ConfigError unless ``sharding_strategy`` is a ``ShardingStrategy`` name, and, for the HYBRID_SHARD
    strategies, ``device_mesh`` is a 2-D mesh (replicate, shard)."""
    if sharding_strategy not in ShardingStrategy.__members__:
        raise ConfigError(
            f"sharding_strategy={sharding_strategy!r}: use one of {list(ShardingStrategy.__members__)}."
        )
    if sharding_strategy.startswith("HYBRID_SHARD") and (device_mesh is None or device_mesh.ndim != 2):
        raise ConfigError(
            f"{sharding_strategy} needs a 2-D device_mesh (replicate, shard); build it with "
            "smolfsdp.sharding.fsdp2.build_mesh(device_type, shard_size, replicate_size)."
        )


def mixed_precision_policy(param_dtype: torch.dtype | None) -> MixedPrecision | None:
    """FSDP1's ``MixedPrecision`` for a compute dtype: ``param_dtype`` parameters, fp32 gradient
    reduction, fp32 buffers; ``None`` (plain fp32) when ``param_dtype`` is None.

    Why fp32 buffers: ``MixedPrecision(buffer_dtype=...)`` casts every buffer, and SmolLM3's rotary
    ``inv_freq`` is one. In bf16 (8-bit mantissa) ``inv_freq`` loses its low bits, and the angle
    ``position x inv_freq`` carries that error times the position: the model would train on other
    positions than the fp32 ones it is served with. Used by :func:`wrap_fsdp1` (native engine) and
    reusable for the Trainer's FSDP1 (accelerate's ``FullyShardedDataParallelPlugin(mixed_precision_policy=...)``).
    """
    if param_dtype is None:
        return None
    return MixedPrecision(param_dtype=param_dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32)


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
            raise ConfigError(
                f"Unknown FSDP config key {key!r}"
                + (did_you_mean(bare, HF_FSDP_CONFIG_KEYS, form="; did you mean {}?") or ".")
                + f" Valid keys: {', '.join(sorted(HF_FSDP_CONFIG_KEYS))}."
            )
        out[bare] = list(value) if isinstance(value, list) else value
    return out


def hf_fsdp_config(
    version: int = 1,
    wrap_class: str = "SmolLM3DecoderLayer",
    *,
    sharding_strategy: str = "FULL_SHARD",
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

    ``sharding_strategy`` travels as ``reshard_after_forward``, the key transformers 5.24 reads
    (``TrainingArguments._process_fsdp_args``): FSDP1 takes the lower-case ``ShardingStrategy`` name
    (``"hybrid_shard"``; accelerate 1.15's ``FullyShardedDataParallelPlugin`` turns it back into
    ``ShardingStrategy.HYBRID_SHARD``, and torch then shards over the GPUs of each node and replicates
    across nodes); FSDP2 takes a bool, so only FULL_SHARD (``True``) and SHARD_GRAD_OP (``False``).

    Raises:
        ConfigError: an unknown strategy, or HYBRID_SHARD / NO_SHARD with ``version=2`` (the Trainer's
            FSDP2 builds HSDP from accelerate's ``ParallelismConfig``, not from ``fsdp_config``).
    """
    strategy = check_trainer_strategy(sharding_strategy, version)
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
                "reshard_after_forward": strategy.lower(),
                "backward_prefetch": backward_prefetch,
                "use_orig_params": True,
                "sync_module_states": bool(sync_module_states),
            }
        )
    else:
        cfg["reshard_after_forward"] = strategy == "FULL_SHARD"
    cfg.update(extra or {})
    return check_hf_fsdp_config(cfg)


def check_trainer_strategy(sharding_strategy: str, version: int) -> str:
    """The strategy's upper-case name, checked for the Trainer's FSDP ``version`` (1 or 2); raises
    ConfigError for an unknown strategy, or HYBRID_SHARD / NO_SHARD with version 2 (see :func:`hf_fsdp_config`)."""
    strategy = str(sharding_strategy).upper()
    if strategy not in SHARDING_STRATEGIES:
        raise ConfigError(f"sharding_strategy={sharding_strategy!r}: use one of {SHARDING_STRATEGIES}.")
    if int(version) == 2 and strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        raise ConfigError(
            f"sharding_strategy={strategy} with the Trainer's FSDP2 (version 2): its fsdp_config takes only "
            "reshard_after_forward true/false. Use version 1 (fsdp_version: 1), or the native engine for HSDP."
        )
    return strategy


def pin_plugin_sharding_strategy(args):
    """Make the Trainer's FSDP1 run the strategy its ``fsdp_config`` names; returns ``args`` (changed).

    Why: transformers 5.24 hands the strategy to accelerate as ``reshard_after_forward``
    (``"hybrid_shard"``), but accelerate 1.15's ``FullyShardedDataParallelPlugin.__post_init__`` also
    fills the deprecated ``sharding_strategy`` with its default (``FSDP_SHARDING_STRATEGY`` or
    ``FULL_SHARD``), and ``Accelerator.prepare_model`` wraps with ``sharding_strategy or
    reshard_after_forward``: FULL_SHARD, whatever was asked (accelerate/accelerator.py,
    accelerate/utils/dataclasses.py). Copying the strategy into ``fsdp_plugin_args["sharding_strategy"]``
    makes both fields agree. FSDP2 (``version: 2``) is left alone: it reads only the bool.

    Args:
        args: a ``TrainingArguments``/``SFTConfig`` built with ``fsdp_config=hf_fsdp_config(1, ...)``.
    """
    plugin = getattr(args, "fsdp_plugin_args", None)
    if plugin and plugin.get("fsdp_version") == 1 and isinstance(plugin.get("reshard_after_forward"), str):
        plugin["sharding_strategy"] = plugin["reshard_after_forward"].upper()
    return args
