"""The bytes a packed micro-batch adds on SDPA's masked path: what ``estimate_memory(packing=True)`` adds.

A packed micro-batch (``smolfsdp.data.packing``) of ``micro_batch`` rows of up to ``seq_len`` tokens is flattened
into one row of ``micro_batch x seq_len`` tokens: the same tokens the estimator already sizes (every row at
``max_length``), so every term linear in tokens is unchanged. What changes is the attention path. Its rows are kept
apart by a block-diagonal mask (``masking_utils.create_causal_mask``), and with a mask transformers' SDPA gives up
``enable_gqa`` (``integrations/sdpa_attention.py``: ``use_gqa_in_sdpa``) and expands K and V to every query head
(``repeat_kv``), and torch's SDPA turns the boolean mask into an additive one in the compute dtype. Each decoder
layer then saves for backward, beyond the unmasked path the estimator models:

    tokens * 2c * head_dim * (heads - kv_heads)   (the expanded K and V in place of the grouped ones)
    + c * rows * row_len^2                         (the additive mask)

with ``rows = 1``, ``row_len = micro_batch x seq_len`` for a packed batch (a padded batch with padding takes the same
path with ``rows = micro_batch``, ``row_len = seq_len``). Checked byte for byte against
``torch.autograd.graph.saved_tensors_hooks`` on the tiny model (``tests/test_packing.py``); on an H200 four
SmolLM3-3B layers in bf16 peaked 0.22 GiB above the unmasked path at 1 x 4,096 tokens, for 0.23 GiB by this count.
Flash attention's varlen path keeps rows apart without a mask and saves none of it. On CPU in bf16 torch's masked
SDPA allocates more than this (a 12-layer SmolLM3 at 2 x 512 tokens, no activation checkpointing: the dry run traced
a peak 4.6 % above the estimate); the count follows the CUDA kernels.

    python -c "from smolfsdp.estimate.packed import masked_attention_bytes as m; print(m('smollm3-3b', 1, 4096, 2))"
"""

from __future__ import annotations

from smolfsdp.estimate.params import resolve_model_config

#: attention implementations that take the masked path for a packed row (None: transformers' default, SDPA)
MASKED_PATH = (None, "sdpa")


def masked_attention_bytes(config, rows: int, row_len: int, compute_bytes: int) -> int:
    """Bytes one decoder layer saves for backward on SDPA's masked path beyond the unmasked path, for ``rows`` rows
    of ``row_len`` tokens in the compute dtype of ``compute_bytes`` (formula in the module docstring). ``config``:
    a model config or a name ``resolve_model_config`` knows."""
    config = resolve_model_config(config)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    tokens = rows * row_len
    return tokens * 2 * compute_bytes * hd * (heads - kv_heads) + compute_bytes * rows * row_len**2


def with_packed_attention(act: dict, config, micro_batch: int, seq_len: int, compute_bytes: int) -> dict:
    """``act`` (``activation_breakdown`` for ``micro_batch x seq_len`` tokens) for one flattened row of
    ``micro_batch x seq_len`` tokens: each decoder layer's masked-path bytes added (``per_layer`` and ``layers``),
    and RoPE's cos and sin over the whole row (``rope``: ``micro_batch`` times the padded batch's one row)."""
    extra = masked_attention_bytes(config, 1, micro_batch * seq_len, compute_bytes)
    return {
        **act,
        "per_layer": act["per_layer"] + extra,
        "layers": act["layers"] + config.num_hidden_layers * extra,
        "rope": act["rope"] * micro_batch,  # cos and sin for every position of the flattened row
    }
