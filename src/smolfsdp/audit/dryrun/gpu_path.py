"""Keeping the dry run on the code path a real GPU run takes where fake tensors would leave it.

transformers reads tensor *values* to choose its attention path; a fake tensor has none, so transformers takes
the conservative branch that a real run never takes for the dry run's batches. Each context manager here
gives that branch the answer real tensors give, and says in its docstring where and why; one more keeps TRL's
fused LM head on its Triton kernels' allocations (``trl_triton_tiles``). Used by
``smolfsdp.audit.dryrun.dry_run.dry_run``; nothing outside the dry run is changed.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import is_fake


@contextmanager
def unpacked_positions():
    """While active, transformers' packed-sequence check answers "not packed" for fake ``position_ids``.

    Why (transformers 5.24): without a KV cache (``use_cache=False``, what activation checkpointing sets,
    ``smolfsdp.sharding.shards.apply_activation_checkpointing``), ``masking_utils._preprocess_mask_arguments``
    (masking_utils.py line 870) calls ``find_packed_sequence_indices(position_ids)`` (line 735), which returns
    None for one sequence per row, but on a traced tensor (``is_tracing``, true for a fake tensor, line 761 and
    ``utils/import_utils.py`` line 1959) returns the packed-sequence mask instead. ``create_causal_mask`` then
    refuses the ``is_causal`` skip (line 996) and ``sdpa_mask`` builds a ``[B, 1, T, T]`` boolean mask; with a
    mask, ``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa`` (line 51) is False, so every layer expands
    K and V to every query head (``repeat_kv``, line 126) and SDPA takes the masked kernel, which saves the expanded
    K/V (and the CPU kernel an fp32 copy of the mask) for backward: tensors a real run never makes. On real
    tensors the model's own ``position_ids`` (``arange(T)``, made in the model's forward when none are given:
    models/llama/modeling_llama.py line 379, qwen2 line 357, smollm3 line 386)
    give None, the mask is skipped, and SDPA runs causal with ``enable_gqa`` (flash attention on CUDA). The
    dry run's micro-batches pass no ``position_ids`` and every row is one full-length sequence
    (``run.micro_batches``), so None is the answer real tensors give. Real ``position_ids`` keep the library's
    own check.
    """
    from transformers import masking_utils  # deferred: transformers takes seconds to import

    original = masking_utils.find_packed_sequence_indices

    def real_answer(position_ids):
        if is_fake(position_ids):
            return None  # the model's own arange(T): one sequence per row, as real tensors answer
        return original(position_ids)

    masking_utils.find_packed_sequence_indices = real_answer
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextmanager
def trl_triton_tiles():
    """While active, TRL's fused LM head allocates on fake tensors what its Triton kernels allocate on a GPU.

    Why (TRL 1.16, ``trl.kernels.chunked_logprob``): ``ChunkedLogProbFunction`` projects each 4,096 x 32,768 tile
    with ``torch.mm(..., out=tile)`` and folds it with a Triton kernel on CUDA (``_forward_kernel``,
    ``_backward_kernel``: registers only, the backward's logits gradient written into the tile), then accumulates
    the gradient matmuls into fp32 with ``torch.addmm(..., out_dtype=torch.float32, out=acc)`` (``_addmm_fp32``).
    Without Triton (``_use_triton`` is False on a CPU device, fake or not) it takes torch stand-ins that make fp32
    copies of every tile (``_forward_tile``: ``tile.float()``, ``exp``; ``_backward_tile``; ``_addmm_fp32``:
    ``a.float()``, ``b.float()``): 0.5 GiB transients a GPU run never makes. Here, for fake tensors only, the
    tile folds allocate nothing (the Triton kernels' in-place effect; no value is read on fake tensors) and the
    accumulation adds a compute-dtype product (``addmm_fp32`` says why not CUDA's in-place overload). Which
    positions are scored is left as on CPU (every position; on CUDA only those with a label,
    ``hidden_states[mask]``, a data-dependent shape fake tensors cannot take): the dry run's rows are labelled
    everywhere, so the two score the same tokens.
    """
    from trl.kernels import chunked_logprob as kernels  # deferred: heavy, and only TRL-engine recipes need it

    originals = (kernels._forward_tile, kernels._backward_tile, kernels._addmm_fp32)

    def forward_tile(tile, *args, **kwargs):
        return None if is_fake(tile) else originals[0](tile, *args, **kwargs)

    def backward_tile(tile, *args, **kwargs):
        return None if is_fake(tile) else originals[1](tile, *args, **kwargs)

    def addmm_fp32(acc, a, b):
        if not is_fake(acc):
            return originals[2](acc, a, b)
        # CUDA: torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc), in place. torch 2.13's FlopCounterMode
        # cannot count that overload (its out_dtype lands on the counter's out_shape), so the product is made in
        # the compute dtype and added: one transient tile-by-hidden tensor (at most 32,768 x hidden) a GPU does
        # not make, freed at once; the FLOPs are counted
        acc.add_(torch.mm(a, b))

    kernels._forward_tile, kernels._backward_tile, kernels._addmm_fp32 = (
        forward_tile,
        backward_tile,
        addmm_fp32,
    )
    try:
        yield
    finally:
        kernels._forward_tile, kernels._backward_tile, kernels._addmm_fp32 = originals
