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


def default_mp_policy(mixed_precision: str) -> MixedPrecisionPolicy | None:
    """bf16 compute with fp32 gradient reduction (torchtitan's default), or None for plain fp32."""
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
