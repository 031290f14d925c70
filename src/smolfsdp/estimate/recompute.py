"""FLOPs the backward recomputes under activation checkpointing, per ``ac_mode`` (``smolfsdp.ac_options``).

"Full checkpointing costs one more forward" is the rule everyone repeats (our own cost tables said it too). With
torch's non-reentrant ``torch.utils.checkpoint`` (what ``checkpoint_wrapper`` and torchtitan use) it is less:
recomputation stops as soon as the last tensor backward needs has been made again
(``torch.utils.checkpoint``, ``_StopRecomputationError``: early stopping, on by default), so the ops after it are
never recomputed. In a decoder layer the last matmul (``down_proj``, or its ``lora_B`` when it is a LoRA target)
feeds only the residual add, which saves nothing: its output is never needed, so it is not recomputed. Per token,
with matmul ``i`` of :func:`smolfsdp.estimate.selective_ac_bytes.layer_matmuls` costing ``2 * in_i * out_i`` FLOPs and the
attention kernel ``4 * heads * head_dim * T`` (its two ``T x T`` products, as PaLM app. B counts them):

* ``full``: every layer recomputes its matmuls but the last, and the attention kernel.
* ``layer`` (every k-th): the same, in the ``floor(n / k)`` checkpointed layers only.
* ``op``: every layer recomputes the matmuls the policy does not cache (the 2nd, 4th, ...:
  ``smolfsdp.sharding.selective_ac.op_sac_policy``) but the last; the attention kernel's outputs are cached.

``tests/test_recompute.py`` holds these to ``torch.utils.flop_counter.FlopCounterMode`` on a small SmolLM3 (real
tensors on the CPU, with and without LoRA, every mode): the matmul FLOPs a checkpointed step adds equal the model
exactly. For SmolLM3-3B, full checkpointing adds 74 % of a forward's FLOPs, not 100 %.

    python -c "from smolfsdp.estimate.recompute import recompute_share as r; print(r('smollm3-3b', 'full', seq_len=2048))"
"""

from __future__ import annotations

from smolfsdp.ac_options import checkpointed_layers
from smolfsdp.estimate.flops import flops_per_token
from smolfsdp.estimate.params import LoraSpec, count_parameters, resolve_model_config
from smolfsdp.estimate.selective_ac_bytes import LINEARS, layer_matmuls


def _matmul_flops(config, lora: LoraSpec | None) -> list[int]:
    """FLOPs per token of each matmul of one layer's forward, in call order (``layer_matmuls``)."""
    h, heads = config.hidden_size, config.num_attention_heads
    hd = getattr(config, "head_dim", None) or h // heads
    width_in = dict(zip(LINEARS, (h, h, h, heads * hd, h, h, config.intermediate_size), strict=True))
    out = []
    for name, width in layer_matmuls(config, lora):
        base, _, part = name.partition(".")
        fan_in = lora.r if part == "lora_B" else width_in[base]
        out.append(2 * fan_in * width)
    return out


def recompute_flops_per_token(
    model="smollm3-3b", mode: str | None = "full", every: int | None = None, *, seq_len: int, lora=None
) -> float:
    """FLOPs per token (summed over the decoder layers) the backward spends recomputing the forward, for
    ``mode`` (None: no checkpointing, 0; else ``full``, ``layer`` with ``every``, ``op``). ``model``: a name, a
    directory or a transformers config (``resolve_model_config``); ``lora``: a ``LoraSpec`` or None. ValueError
    for an unknown mode."""
    if mode is None:
        return 0.0
    config = resolve_model_config(model)
    mm = _matmul_flops(config, lora)
    heads = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    attention = 4 * heads * hd * seq_len
    n = config.num_hidden_layers
    if (
        mode == "op"
    ):  # cached: the 1st, 3rd, ... matmul and the attention kernel; the last matmul is never needed
        return float(n * sum(f for i, f in enumerate(mm[:-1]) if i % 2 == 1))
    layers = len(checkpointed_layers(n, mode, every))
    return float(layers * (sum(mm[:-1]) + attention))


def recompute_share(
    model="smollm3-3b", mode: str | None = "full", every: int | None = None, *, seq_len: int, lora=None
) -> dict:
    """The recomputation against the step's model FLOPs (``flops_per_token``: 6N + 12·L·H·Q·T, frozen weights
    4N) and against one forward of the decoder layers (their matmuls and attention kernel): ``{"flops_per_token",
    "of_step", "of_forward"}`` (fractions)."""
    config = resolve_model_config(model)
    counts = count_parameters(config, lora)
    heads = config.num_attention_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    step = flops_per_token(
        counts.total, config.num_hidden_layers, heads, int(hd), seq_len, trainable_params=counts.trainable
    )
    forward = config.num_hidden_layers * (sum(_matmul_flops(config, lora)) + 4 * heads * hd * seq_len)
    extra = recompute_flops_per_token(config, mode, every, seq_len=seq_len, lora=lora)
    return {"flops_per_token": extra, "of_step": extra / step, "of_forward": extra / forward}


def recompute_words(
    model, mode: str | None, every: int | None, *, seq_len: int, lora=None, why: bool = True
) -> str:
    """'recomputes 74% of the decoder layers' forward FLOPs in backward, +23% FLOPs per step' for a cost line
    (``why``: with the reason it is not 100 % and this module's name)."""
    if mode is None:
        return "no recomputation"
    s = recompute_share(model, mode, every, seq_len=seq_len, lora=lora)
    reason = " (torch's checkpoint stops before the last matmul; smolfsdp.estimate.recompute)" if why else ""
    return (
        f"recomputes {s['of_forward']:.0%} of the decoder layers' forward FLOPs in backward, "
        f"+{s['of_step']:.0%} FLOPs per step{reason}"
    )
