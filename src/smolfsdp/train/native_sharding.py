"""How the native engine shards the model: the data-parallel mesh a config asks for, then FSDP2 or FSDP1.

``shard_model`` is the stage between building the model (``smolfsdp.train.native.build``, LoRA adapters
included) and creating the optimizer: :func:`mesh_layout` turns the sharding strategy and the world size into
a ``(replicate, shard)`` mesh shape, :func:`shard_fsdp2` applies activation checkpointing and ``fully_shard``
per decoder layer then the root (chapter "LoRA + FSDP2" shows it), :func:`shard_fsdp1` wraps with
``FullyShardedDataParallel``. The evidence it returns (units, parameter type, mesh) goes into ``summary.json``.

    torchrun --standalone --nproc-per-node 2 -m smolfsdp.cli train --fsdp_version 2 --lora true
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from smolfsdp.config import TrainConfig
from smolfsdp.models.modeling import decoder_layers, resolve_wrap_class
from smolfsdp.sharding import fsdp1, fsdp2
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.sharding.selective_ac import apply_selective_activation_checkpointing
from smolfsdp.sharding.shards import apply_activation_checkpointing


def shard_model(model: nn.Module, cfg, info: DistInfo) -> tuple[nn.Module, dict[str, Any]]:
    """Wrap ``model`` with FSDP1 or FSDP2 as ``cfg`` asks; return it and evidence of what happened.

    The data-parallel mesh is ``(replicate, shard)`` from ``cfg.sharding_strategy`` and the real world
    size (:func:`mesh_layout`). FSDP2 (:func:`shard_fsdp2`) gets a 2-D mesh for HYBRID_SHARD and NO_SHARD, a
    1-D one otherwise, and ``reshard_after_forward=False`` for SHARD_GRAD_OP; FSDP1 (:func:`shard_fsdp1`) gets
    the strategy by name and, for HYBRID_SHARD, the 2-D mesh. Raises ConfigError when the mesh does not fit
    the world size.
    """
    wrap_cls = resolve_wrap_class(model, cfg.wrap_class)
    n_layers = len(decoder_layers(model, wrap_cls))
    layout = mesh_layout(cfg, info)
    if cfg.fsdp_version == 1:
        model = shard_fsdp1(model, cfg, info, wrap_cls, layout)
        units, local = len(fsdp1.fsdp_units(model)), fsdp1.local_numel(model)
        param_type = "FlatParameter"
        # FSDP1: fixed by the strategy
        reshard = cfg.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
    else:
        model = shard_fsdp2(model, cfg, info, wrap_cls, layout)
        units, local = len(fsdp2.fsdp_units(model)), fsdp2.local_numel(model)
        param_type, reshard = "DTensor", layout["reshard_after_forward"]
    two_d = layout["two_d"]
    evidence = {
        "wrap_class": wrap_cls.__name__,
        "decoder_layers": n_layers,
        "fsdp_units": units,
        "parameter_type": param_type,
        "sharding_strategy": cfg.sharding_strategy,
        # the data-parallel layout that ran: FSDP2's DeviceMesh, or FSDP1's process groups in the same shape
        "mesh_shape": [layout["replicate"], layout["shard"]] if two_d else [layout["shard"]],
        "mesh_dim_names": list(fsdp2.MESH_DIM_NAMES) if two_d else ["dp_shard"],
        "reshard_after_forward": reshard,
    }
    return model, {**evidence, "local_numel": local}


def mesh_layout(cfg: TrainConfig, info: DistInfo) -> dict[str, Any]:
    """The data-parallel layout ``cfg`` asks for on this world: ``replicate`` x ``shard`` ranks
    (``fsdp2.resolve_mesh_shape``; ``LOCAL_WORLD_SIZE`` = processes per node for HYBRID_SHARD's default),
    ``two_d`` (FSDP2's mesh is 2-D for HYBRID_SHARD and NO_SHARD) and FSDP2's ``reshard_after_forward``
    (False for SHARD_GRAD_OP). Raises ConfigError when the shape does not fit the world size."""
    strategy = cfg.sharding_strategy
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    replicate, shard = fsdp2.resolve_mesh_shape(
        strategy, info.world_size, cfg.replicate_size, cfg.shard_size, local_world_size=local_world
    )
    return {
        "replicate": replicate,
        "shard": shard,
        "two_d": strategy in ("HYBRID_SHARD", "NO_SHARD"),
        "reshard_after_forward": cfg.reshard_after_forward and strategy != "SHARD_GRAD_OP",
    }


def shard_fsdp2(model: nn.Module, cfg: TrainConfig, info: DistInfo, wrap_cls, layout: dict) -> nn.Module:
    """FSDP2 as the native engine applies it: activation checkpointing on each decoder layer first, then
    ``fully_shard`` per layer and the root (``fsdp2.apply_fsdp2``) over the mesh of ``layout``
    (:func:`mesh_layout`), bf16 compute with fp32 reduction under ``mixed_precision: bf16``, the shards on
    the host with ``cpu_offload``. Returns the same module, sharded in place."""
    if cfg.activation_checkpointing:
        _apply_ac(model, wrap_cls, cfg)
    replicate = layout["replicate"] if layout["two_d"] else None
    mesh = fsdp2.build_mesh(info.device.type, layout["shard"], replicate)
    offload = fsdp2.make_offload_policy() if cfg.cpu_offload else None
    # No model.to(device) first: each fully_shard call moves only its own group's parameters to the
    # mesh's device, shards them (and with offload puts the shards back on the host), so the device
    # never holds the whole model (torch/distributed/fsdp/_fully_shard/_fsdp_init.py).
    return fsdp2.apply_fsdp2(
        model,
        mesh,
        wrap_cls,
        mp_policy=fsdp2.default_mp_policy(cfg.mixed_precision),
        offload_policy=offload,
        reshard_after_forward=layout["reshard_after_forward"],
    )


def shard_fsdp1(model: nn.Module, cfg: TrainConfig, info: DistInfo, wrap_cls, layout: dict) -> nn.Module:
    """FSDP1 as the native engine applies it (``fsdp1.wrap_fsdp1``), then activation checkpointing inside
    the units; HYBRID_SHARD gets the 2-D mesh of ``layout``, NO_SHARD runs by name on the default group.
    Returns the ``FullyShardedDataParallel`` root."""
    hybrid = cfg.sharding_strategy == "HYBRID_SHARD"
    model = fsdp1.wrap_fsdp1(
        model,
        wrap_cls,
        device=info.device,
        sharding_strategy=cfg.sharding_strategy,
        device_mesh=fsdp2.build_mesh(info.device.type, layout["shard"], layout["replicate"])
        if hybrid
        else None,
        backward_prefetch=cfg.backward_prefetch,
        cpu_offload=cfg.cpu_offload,
        param_dtype=torch.bfloat16 if cfg.mixed_precision == "bf16" else None,
        use_orig_params=cfg.use_orig_params,
        lora_layout=cfg.lora_layout,
    )
    if cfg.activation_checkpointing:
        _apply_ac(model, wrap_cls, cfg)
    return model


def _apply_ac(model: nn.Module, wrap_cls, cfg: TrainConfig) -> None:
    """Activation checkpointing as ``cfg.ac_mode`` says: ``full``, ``layer`` or ``op`` (``smolfsdp.ac_options``)."""
    if cfg.ac_mode == "full":
        apply_activation_checkpointing(model, wrap_cls)
    else:
        apply_selective_activation_checkpointing(model, wrap_cls, cfg.ac_mode, cfg.ac_every)
