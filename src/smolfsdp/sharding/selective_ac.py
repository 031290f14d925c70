"""Selective activation checkpointing: every k-th decoder layer, or op-level with a save policy.

The native engine and the dry run apply it (``smolfsdp.train.native.shard_model``) for ``ac_mode`` ``layer`` and
``op`` (``smolfsdp.ac_options``); ``ac_mode: full`` stays :func:`smolfsdp.sharding.shards.apply_activation_checkpointing`.
Both follow torchtitan at 9dec370 (2024-12; ``torchtitan/parallelisms/parallelize_llama.py``,
``_apply_ac_to_transformer_block``): a layer is wrapped by ``checkpoint_wrapper`` (non-reentrant
``torch.utils.checkpoint``), for ``op`` with ``context_fn=create_selective_checkpoint_contexts(policy)``.

What the ``op`` policy saves (:func:`op_sac_policy`), torchtitan's ``_save_list`` and its rule:

* every other matmul's output (the 1st, 3rd, ... ``aten.mm`` of a layer's forward; the 2nd, 4th, ... are
  recomputed): in a SmolLM3 / Llama layer q_proj, v_proj, gate_proj and down_proj are kept, k_proj, o_proj and
  up_proj recomputed. Matmuls are the expensive ops to recompute; torchtitan keeps half of them to halve their
  bytes. ``aten.addmm`` (a Linear with a bias: Qwen2.5's q/k/v) counts as a matmul here; torchtitan's Llama has
  no biases, so it only needed ``aten.mm``.
* the fused attention kernels' outputs (output and logsumexp): ``_scaled_dot_product_flash_attention`` and
  ``_efficient_attention`` (CUDA, torchtitan's list), ``_cudnn_attention``, and
  ``_scaled_dot_product_flash_attention_for_cpu`` (what the CPU dry run and CPU tests take; not in torchtitan).
* ``reduce_scatter_tensor`` (tensor parallelism's functional collective), ``abs`` and ``max`` (float8 scales):
  torchtitan's list, kept for fidelity; a bf16 SmolLM3 layer under FSDP calls none of them in forward.

Not ``aten.bmm``: only eager attention calls it, for the ``s x s`` scores, which selective recomputation exists
to drop (Korthikanti et al. 2022, sec. 5). Everything else (RMSNorm, RoPE, SiLU, the residual adds) is
recomputed. ``smolfsdp.estimate.selective_ac_bytes`` models the same choice.

    smolfsdp train --config configs/runs/smoke.yaml --activation_checkpointing --ac_mode op
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from smolfsdp.ac_options import checkpointed_layers
from smolfsdp.models.modeling import decoder_layers

aten = torch.ops.aten
#: ops counted as matmuls by the ``op`` policy (every other one saved)
MATMUL_OPS = frozenset({aten.mm.default, aten.addmm.default})
#: ops whose outputs the ``op`` policy saves (the matmuls: every other one)
SAVE_OPS = frozenset(
    {
        *MATMUL_OPS,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        aten.abs.default,
        aten.max.default,
    }
)


def op_sac_policy() -> Callable:
    """A fresh policy for one checkpointed call: ``MUST_SAVE`` for :data:`SAVE_OPS` except every second matmul,
    ``PREFER_RECOMPUTE`` otherwise. Forward and recompute count their matmuls apart, so both choose the same
    ones (torchtitan's ``_get_custom_policy``)."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in MATMUL_OPS:
            counts[mode] += 1
        if func in SAVE_OPS and not (func in MATMUL_OPS and counts[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_sac_context():
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint``: the forward and recompute dispatch modes of
    :func:`op_sac_policy` (``create_selective_checkpoint_contexts``), made anew for every call."""
    return create_selective_checkpoint_contexts(op_sac_policy())


def apply_selective_activation_checkpointing(
    model: nn.Module, wrap_cls: type[nn.Module], mode: str, every: int | None = None
) -> list[int]:
    """Wrap the ``wrap_cls`` layers ``smolfsdp.ac_options.checkpointed_layers(n, mode, every)`` picks in a
    non-reentrant ``checkpoint_wrapper`` (``op``: with :func:`op_sac_context`); turn the KV cache off (see
    ``shards.apply_activation_checkpointing``). Returns the indices of the wrapped layers."""
    config = getattr(model, "config", None)  # the HF config, through FSDP1's and peft's wrappers
    if config is not None:
        config.use_cache = False
    layers = decoder_layers(model, wrap_cls)
    chosen = checkpointed_layers(len(layers), mode, every)
    ids = {id(layers[i]) for i in chosen}
    extra = {"context_fn": op_sac_context} if mode == "op" else {}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
            m, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra
        ),
        check_fn=lambda m: id(m) in ids,
    )
    return chosen
