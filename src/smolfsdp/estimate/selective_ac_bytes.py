"""Bytes kept for backward under selective activation checkpointing (``ac_mode`` ``layer`` and ``op``).

``smolfsdp.estimate.memory.estimate_memory`` and ``smolfsdp.estimate.moments.peak_moments`` call
:func:`checkpointed_bytes` for every mode (``full`` included); the policies are named in ``smolfsdp.ac_options``
and applied by ``smolfsdp.sharding.selective_ac`` (torchtitan's at 9dec370, 2024-12). Per token, with ``c`` the
compute itemsize, ``h`` the hidden size, ``P`` the bytes one layer saves without checkpointing
(``activation_breakdown``'s ``per_layer``) and ``n`` layers:

* ``full``: each layer keeps its input, ``n * c*h``; its backward first recomputes ``P``.
* ``layer`` (every k-th, ``m = floor(n / k)`` checkpointed): ``m * c*h + (n - m) * P``; the last layer's
  backward recomputes ``P`` only when it is one of the checkpointed (``n % k == 0``).
* ``op``: each layer keeps its input and what the policy caches, ``n * (c*h + S)`` with ``S`` the outputs of
  every other matmul (:func:`layer_matmuls`, in call order; SmolLM3 / Llama: q, v, gate, down:
  ``c*(q + kv + f + h)``) and of the fused attention kernel (``c*heads*hd + 4*heads``: output and fp32
  logsumexp). Its backward recomputes ``P - S``: the cached outputs are reused, not made again, and those
  the graph does not save (q_proj's and down_proj's) are dropped once used.

Held to the fake-tensor dry run (peak at its moment, estimate vs traced): a scaled-down SmolLM3 (12 layers,
hidden 512, 1 x 512 tokens, FSDP2) -2.06 % every 2nd layer, -0.09 % op (-0.14 % op with LoRA; FSDP1 the same), in
``tests/test_selective_ac.py``; SmolLM3-3B full fine-tune, FSDP2, 2 ranks, 2 x 2048 tokens, by hand: -2.05 % every
2nd layer, -0.03 % op. The every-k-th gap is the dry run's: with the KV cache off (as checkpointing sets it) the
layers left unchecked take an attention path only fake tensors take (a 4-D mask, K/V expanded to every head);
the same model without checkpointing traces 3.1 % above the estimate with the cache off, 0.0 % with it on.

    python -c "from smolfsdp.estimate.memory import estimate_memory as e; print(e(activation_checkpointing=True, ac_mode='op').activations_bytes / 2**30)"
"""

from __future__ import annotations

from smolfsdp.ac_options import checkpointed_layers
from smolfsdp.estimate.params import LoraSpec

#: the linear layers of a decoder layer in the order its forward calls them (attention, then the MLP)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_matmuls(config, lora: LoraSpec | None = None) -> list[tuple[str, int]]:
    """``(name, out_features)`` of each matmul one decoder layer's forward runs, in order: each linear, and
    for a LoRA target after it its ``lora_A`` (``r``) and ``lora_B`` (the linear's width), as peft's
    ``Linear.forward`` calls them (base layer first)."""
    h, heads = config.hidden_size, config.num_attention_heads
    hd = getattr(config, "head_dim", None) or h // heads
    kv, f = config.num_key_value_heads * hd, config.intermediate_size
    width = dict(zip(LINEARS, (heads * hd, kv, kv, h, f, f, h), strict=True))
    out = []
    for name in LINEARS:
        out.append((name, width[name]))
        if lora is not None and name in lora.targets:
            out += [(f"{name}.lora_A", lora.r), (f"{name}.lora_B", width[name])]
    return out


def op_saved_bytes_per_token(config, compute_bytes: int, lora: LoraSpec | None = None) -> int:
    """``S``: bytes per token one layer's ``op`` policy caches: the 1st, 3rd, ... matmul's output
    (``smolfsdp.sharding.selective_ac.op_sac_policy``) and the attention kernel's output and logsumexp."""
    heads = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    matmuls = sum(width for i, (_, width) in enumerate(layer_matmuls(config, lora)) if i % 2 == 0)
    return compute_bytes * (matmuls + heads * hd) + 4 * heads


def checkpointed_bytes(
    config, act: dict, tokens: int, compute_bytes: int, mode: str | None, every: int | None, lora=None
) -> tuple[int, int]:
    """``(kept, recompute)``: bytes the decoder layers keep from forward to backward, and what the last
    layer's backward adds when it recomputes, for ``mode`` (None: no checkpointing; else one of
    ``smolfsdp.ac_options.AC_MODES``). ``act``: ``activation_breakdown`` for the same ``tokens``."""
    if mode is None:
        return act["layers"], 0
    n, per_layer, inputs = config.num_hidden_layers, act["per_layer"], act["layer_inputs"]
    if mode == "full":
        return inputs, per_layer
    if mode == "op":
        cached = tokens * op_saved_bytes_per_token(config, compute_bytes, lora)
        return inputs + n * cached, per_layer - cached
    chosen = checkpointed_layers(n, mode, every)
    first_layer_saving = (
        n * per_layer - act["layers"]
    )  # LoRA: layer 0 saves less; never checkpointed for k > 1
    kept = act["layers"] - len(chosen) * per_layer + len(chosen) * (inputs // n)
    kept += first_layer_saving if 0 in chosen else 0
    return kept, per_layer if n - 1 in chosen else 0
