"""FSDP2: ``fully_shard`` per decoder layer, then the root (torchtitan's ``apply_fsdp`` shape).

FSDP2 keeps every parameter as a ``DTensor`` sharded on dim 0 (``Shard(0)``) over a device mesh;
no FlatParameter. Used by the fine-tune, FSDP1-vs-FSDP2 and LoRA chapters.

    torchrun --nproc-per-node 2 -m smolfsdp.cli train --engine native --fsdp_version 2
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def apply_fsdp2(
    model: nn.Module,
    mesh,
    wrap_cls: type[nn.Module],
    *,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload_policy: CPUOffloadPolicy | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard ``model`` in place: ``fully_shard`` each ``wrap_cls`` module, then the root.

    The root group holds what no layer owns: the embedding, the final norm and ``lm_head``. SmolLM3
    ties ``lm_head.weight`` to ``embed_tokens.weight``, so both stay in that one group and stay tied.

    Args:
        mesh: a 1-D ``DeviceMesh`` (FULL_SHARD) over all ranks.
        mp_policy: e.g. ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``.
        offload_policy: ``CPUOffloadPolicy(pin_memory=...)`` keeps shards and optimizer state on the host.
        reshard_after_forward: free gathered layers after forward (ZeRO-3) or keep them to backward (ZeRO-2).
    Returns the same module, now an ``FSDPModule``.
    """
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if offload_policy is not None:
        kwargs["offload_policy"] = offload_policy
    for module in [m for m in model.modules() if isinstance(m, wrap_cls)]:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def build_mesh(device_type: str, shard_size: int, replicate_size: int = 1):
    """A 1-D mesh (``dp_shard``) or, with ``replicate_size > 1``, a 2-D HSDP mesh (``dp_replicate``, ``dp_shard``).

    Raises ConfigError when the mesh needs more ranks than the process group has.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from smolfsdp.config import ConfigError

    world = dist.get_world_size()
    if shard_size * replicate_size > world:
        raise ConfigError(
            f"a mesh of {replicate_size} x {shard_size} = {shard_size * replicate_size} ranks is larger "
            f"than the world size {world}; launch more processes or shrink the mesh."
        )
    if replicate_size > 1:
        return init_device_mesh(
            device_type, (replicate_size, shard_size), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    return init_device_mesh(device_type, (shard_size,), mesh_dim_names=("dp_shard",))


def make_offload_policy(pin_memory: bool | None = None) -> CPUOffloadPolicy:
    """``CPUOffloadPolicy``; pinned host memory only where CUDA exists (pinning needs a CUDA driver).

    Raises ConfigError when pinned memory is asked for on a machine without CUDA.
    """
    from smolfsdp.config import ConfigError

    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    if pin_memory and not torch.cuda.is_available():
        raise ConfigError(
            "CPU offload with pin_memory=True needs CUDA (page-locked host memory is a CUDA driver "
            "feature); on this machine use pin_memory=False."
        )
    return CPUOffloadPolicy(pin_memory=pin_memory)


def default_mp_policy(mixed_precision: str) -> MixedPrecisionPolicy | None:
    """bf16 compute with fp32 gradient reduction (torchtitan's default), or None for plain fp32.

    Why: bf16 all-gathers and matmuls halve communication and use tensor cores, while reducing
    gradients in fp32 keeps the sum over ranks from losing the low bits (bf16 has an 8-bit
    mantissa); the sharded parameters and optimizer state stay fp32.
    """
    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def local_numel(model: nn.Module) -> int:
    """Elements of the parameter shards this rank holds (tied parameters counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return total


def describe_sharding(model: nn.Module) -> pd.DataFrame:
    """One row per parameter: name, type, placement, local/global shape and numel, dtype, requires_grad."""
    rows = []
    for name, p in model.named_parameters():
        is_dt = isinstance(p, DTensor)
        local = p.to_local() if is_dt else p
        rows.append(
            {
                "name": name,
                "type": "DTensor" if is_dt else type(p).__name__,
                "placement": str(tuple(p.placements)) if is_dt else "",
                "local_shape": tuple(local.shape),
                "global_shape": tuple(p.shape),
                "local_numel": local.numel(),
                "global_numel": p.numel(),
                "dtype": str(p.dtype).replace("torch.", ""),
                "requires_grad": p.requires_grad,
            }
        )
    return pd.DataFrame(rows)
