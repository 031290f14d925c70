"""Bytes autograd saves for backward in one forward of SmolLM3-like models, tensor by tensor.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``); ``smolfsdp.estimate.memory`` adds
these to the static bytes. Checked byte for byte against ``torch.autograd.graph.saved_tensors_hooks``
in ``tests/test_memory.py``.

    python -c "from smolfsdp.measure import activations as a, params as p; print(a.activation_breakdown(p.resolve_model_config('tiny'), 64, 64, 4))"
"""

from __future__ import annotations

import pandas as pd

from smolfsdp.estimate.params import LoraSpec


def activation_breakdown(
    config,
    tokens: int,
    seq_len: int,
    compute_bytes: int,
    lora: LoraSpec | None = None,
    base_grads: bool = False,
):
    """Bytes autograd saves for backward in one forward of ``tokens = micro_batch * seq_len`` tokens.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4)
    count ``s*b*h*(34 + 5*a*s/h)`` per GPT layer in fp16. For SmolLM3 (RMSNorm computed in fp32, GQA,
    SwiGLU, no dropout, SDPA/flash attention that keeps only q, k, v, the output and a fp32
    logsumexp, never the ``s^2`` scores) the same per-tensor accounting gives, per token and layer,
    with ``c`` the compute itemsize::

        8h + 6ch + 2c*kv + 4c*f + 4*heads + 8      (full fine-tune)

    2 norms x (fp32 input 4h + rsqrt 4 + normalised ch) + norm outputs saved by q/k/v and gate/up
    (2ch) + q (ch) + k, v (2c*kv) + attention output = o_proj input (ch) + logsumexp (4*heads) +
    SwiGLU gate, silu(gate), up, down input (4cf). With LoRA, frozen weights drop the saves that
    only their weight-gradient needs (norm ``ch``, gate/up and down inputs, lm_head input) and add
    ``c*r`` per adapter (and, with ``lora.dropout`` > 0, ``(c + 1) * in_features`` per adapter: the dropped
    input lora_A saves and the dropout's bool mask, as CUDA's fused dropout keeps it, in place of the undropped
    input); layer 0's input norm saves nothing, nor do its q/k/v dropouts keep a mask. ``base_grads``
    (FSDP1 with LoRA): the decoder layers save as in full fine-tuning, plus the adapters' tensors (its input needs no gradient). The loss
    saves the fp32 log-softmax (4V per token) and int64 targets (and the embedding its int64 ids). Checked byte for byte against
    ``torch.autograd.graph.saved_tensors_hooks`` in tests/test_memory.py.
    """
    h, f, heads, c = config.hidden_size, config.intermediate_size, config.num_attention_heads, compute_bytes
    hd = getattr(config, "head_dim", None) or h // heads
    kv, n_layers, V = config.num_key_value_heads * hd, config.num_hidden_layers, config.vocab_size
    attn_core = 2 * c * h + 2 * c * kv + 4 * heads  # q, output (= o_proj input), k, v, logsumexp
    if lora is not None and base_grads:
        # FSDP1 + LoRA: a layer's FlatParameter holds adapters, so it (and every frozen weight viewed from it)
        # requires grad: the layer saves what full fine-tuning saves, plus the adapters' own tensors
        full = activation_breakdown(config, tokens, seq_len, c)
        extra = tokens * n_layers * _adapter_bytes(lora, c, h, f, heads * hd)
        adapters = {"per_layer": full["per_layer"] + extra // n_layers, "layers": full["layers"] + extra}
        lora_only = activation_breakdown(config, tokens, seq_len, c, lora)  # the root stays frozen
        return {**full, **adapters, "head": lora_only["head"], "loss": lora_only["loss"]}
    if lora is None:
        norm = 4 * h + 4 + c * h
        layer = 2 * norm + 2 * c * h + attn_core + 4 * c * f
        first_layer_saving = 0
        head = norm + c * h  # final norm + lm_head input
        ids = 8 * tokens  # int64 input ids, saved for the embedding's weight gradient
    else:
        t = set(lora.targets)
        norm = 4 * h + 4
        # targeted projections' inputs, saved for lora_A; with dropout it keeps the dropped copy (_adapter_bytes)
        kept = lora.dropout == 0
        linear_in = (
            kept * c * h * (bool(t & {"q_proj", "k_proj", "v_proj"}) + bool(t & {"gate_proj", "up_proj"}))
        )
        layer = (
            2 * norm
            + linear_in
            + attn_core
            + 3 * c * f
            + kept * c * f * ("down_proj" in t)
            + c * lora.r * len(t)
        )
        layer += _adapter_bytes(lora, c, h, f, heads * hd) - c * lora.r * len(t)  # dropout only
        # layer 0's input norm saves nothing, and its q/k/v dropouts keep no mask (their input needs no gradient)
        first_layer_saving = norm + (lora.dropout > 0) * h * len(t & {"q_proj", "k_proj", "v_proj"})
        head = norm
        ids = 0
    rope = 2 * seq_len * hd * c  # cos and sin, shared by every layer and every sequence
    layers_bytes = tokens * (n_layers * layer - first_layer_saving)
    loss = tokens * (4 * V + 8) + 4 + ids  # fp32 log-softmax, int64 targets, the 0-d loss scale
    return {
        "per_layer": tokens * layer,
        "layers": layers_bytes,
        "layer_inputs": tokens * n_layers * c * h,  # what per-layer activation checkpointing keeps
        "head": tokens * head,
        "rope": rope,
        "loss": loss,
        "logits": tokens * V * (c + (4 if c != 4 else 0)),  # logits held by the output + fp32 upcast
    }


def _adapter_bytes(lora: LoraSpec, c: int, h: int, f: int, attn_out: int) -> int:
    """Per token and layer, what the adapters save: lora_A's output (``c*r``, lora_B's input) each, and with
    ``lora.dropout`` > 0 the dropped input (lora_A's input, ``c * in_features``) and the dropout's bool mask."""
    fan_in = {"o_proj": attn_out, "down_proj": f}
    per = sum(
        c * lora.r + ((c + 1) * fan_in.get(name, h) if lora.dropout > 0 else 0) for name in lora.targets
    )
    return per


def saved_activation_bytes(config, tokens: int, seq_len: int, compute_bytes: int, lora=None) -> int:
    """All bytes autograd holds for backward after forward + loss (no activation checkpointing)."""
    b = activation_breakdown(config, tokens, seq_len, compute_bytes, lora)
    return b["layers"] + b["head"] + b["rope"] + b["loss"]


#: what backward keeps of one decoder layer: everything autograd saves, only the layer's input (full
#: recomputation, i.e. activation checkpointing per layer), or all but the attention scores (selective)
RECOMPUTE = ("none", "selective", "full")


def layer_activation_bytes(config, tokens: int, compute_bytes: int, recompute: str = "none") -> int:
    """Bytes one decoder layer keeps for backward over ``tokens = micro_batch * seq_len`` tokens (full
    fine-tune; RoPE's shared cos/sin are counted once per model, not here).

    ``none``: ``tokens * (8h + 6ch + 2c*kv + 4cf + 4*heads + 8)`` (:func:`activation_breakdown`'s layer).
    ``full``: ``tokens * c*h``, the layer's input alone (the rest is recomputed in backward).
    ``selective`` (Korthikanti et al. 2022, sec. 5: recompute only the attention core, dropping its
    ``s x s`` terms): the same bytes as ``none`` for SmolLM3, because SDPA/flash attention never keeps the
    attention scores and already recomputes them in backward; for a GPT layer with eager attention see
    :func:`gpt_layer_activation_bytes`. Checked against ``saved_tensors_hooks`` in tests/test_memory.py.
    Raises ValueError for another ``recompute``.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r}: use one of {', '.join(RECOMPUTE)}.")
    if recompute == "full":
        return tokens * compute_bytes * config.hidden_size
    b = activation_breakdown(config, tokens, tokens, compute_bytes)  # seq_len only sizes RoPE, left out here
    return b["per_layer"]


def gpt_layer_activation_bytes(
    seq_len: int, micro_batch: int, hidden: int, heads: int, recompute: str = "none"
) -> int:
    """The Ultra-Scale Playbook's and Korthikanti et al.'s per-layer count for a GPT layer in 16-bit
    (no tensor or sequence parallelism, with dropout, eager attention): ``none`` ``s*b*h*(34 + 5*a*s/h)``;
    ``selective`` ``34*s*b*h`` (the ``5*a*s^2*b`` attention scores, softmax and dropout recomputed);
    ``full`` ``2*s*b*h`` (the layer's input). Raises ValueError for another ``recompute``."""
    s, b, h, a = seq_len, micro_batch, hidden, heads
    counts = {"none": s * b * h * 34 + 5 * a * s * s * b, "selective": 34 * s * b * h, "full": 2 * s * b * h}
    if recompute not in counts:
        raise ValueError(f"recompute={recompute!r}: use one of {', '.join(RECOMPUTE)}.")
    return counts[recompute]


def recompute_table(config, seq_len: int, micro_batch: int, compute_bytes: int = 2):
    """Per decoder layer and in total over the layers, GiB kept for backward under each ``recompute``
    (:func:`layer_activation_bytes`), beside the GPT formula at the same ``h``, heads, ``s``, ``b``."""
    tokens = seq_len * micro_batch
    rows = {}
    for r in RECOMPUTE:
        layer = layer_activation_bytes(config, tokens, compute_bytes, r)
        gpt = gpt_layer_activation_bytes(
            seq_len, micro_batch, config.hidden_size, config.num_attention_heads, r
        )
        rows[r] = {
            "per layer (GiB)": layer / 2**30,
            f"all {config.num_hidden_layers} layers (GiB)": layer * config.num_hidden_layers / 2**30,
            "GPT formula, per layer (GiB)": gpt / 2**30,
        }
    return pd.DataFrame(rows).T.rename_axis("recomputation")
