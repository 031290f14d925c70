"""What a sharded model holds on this rank, and activation checkpointing of its layers.

Used by the native engine (``smolfsdp.train.native``: parameter and optimizer bytes in the summary),
the benchmark meter (``smolfsdp.measure.benchmark``: tensor bytes per step) and the book's mechanics
recorder and GPU check.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as _torch_apply_activation_checkpointing,
)
from torch.distributed.tensor import DTensor

from smolfsdp.sharding.fsdp1 import fsdp_units


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (what the rank really allocated); a ``DTensor``
    counts its local shard."""
    seen, total = set(), 0
    for t in tensors:
        st = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
        # the storage's own identity, not its data pointer: fake tensors (the dry run) all point at 0
        if st._cdata not in seen:
            seen.add(st._cdata)
            total += st.nbytes()
    return total


def local_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The parameter tensors this rank holds: FSDP1's ``FlatParameter`` shards, else each parameter's
    local shard (FSDP2 ``DTensor``) or the parameter itself (unsharded)."""
    units = fsdp_units(model)
    if units:  # FSDP1: the FlatParameter shards
        return [u._flat_param for u in units if getattr(u, "_flat_param", None) is not None]
    return [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]


def apply_activation_checkpointing(model: nn.Module, wrap_cls: type[nn.Module]) -> None:
    """Recompute each ``wrap_cls`` layer in backward (non-reentrant); turns the model's KV cache off.

    Why ``use_cache=False``: SmolLM3's config keeps ``use_cache=True``, so a training forward builds a
    ``DynamicCache`` and every layer appends its keys and values to it; the recompute in backward
    appends them a second time, and with a padding mask the attention then sees twice the key length
    ("The size of tensor a (2n) must match the size of tensor b (n)").
    """
    config = getattr(model, "config", None)  # the HF config, through FSDP1's and peft's wrappers
    if config is not None:
        config.use_cache = False
    _torch_apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, wrap_cls),
    )
