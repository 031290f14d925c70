"""Model FLOPs per token and the time a number of tokens takes at an MFU: the formula MFU is set against.

PaLM appendix B (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", arXiv:2204.02311):
``6 N + 12 L H Q T`` per token of a training step. ``smolfsdp.measure.benchmark`` divides measured tokens/s by
it (MFU); ``smolfsdp.estimate.scaling`` and ``smolfsdp.estimate.recompute`` build step times and recomputation
shares on it. Chapters "Reading the profiler" and "Scaling out".

    python -c "from smolfsdp.estimate.flops import flops_per_token; print(flops_per_token(3e9, 36, 16, 128, 2048))"
"""

from __future__ import annotations


def flops_per_token(
    n_params: int,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    seq_len: float,
    trainable_params: int | None = None,
) -> float:
    """Model FLOPs per token of one training step (forward + backward): ``6N + 12·L·H·Q·T``.

    PaLM appendix B (Chowdhery et al. 2022). ``trainable_params`` < ``n_params`` (LoRA): the frozen
    weights cost 4 FLOPs per parameter (no weight gradient), the trainable ones 6. Raises ValueError
    for non-positive sizes.
    """
    if min(n_params, n_layers, n_heads, head_dim) <= 0 or seq_len <= 0:
        raise ValueError("flops_per_token: sizes must be positive")
    trainable = n_params if trainable_params is None else trainable_params
    dense = 4 * n_params + 2 * trainable
    return float(dense + 12 * n_layers * n_heads * head_dim * seq_len)


def training_time_s(tokens: float, flops_token: float, peak_tflops: float, n_gpus: int, mfu: float) -> float:
    """Estimated seconds to process ``tokens`` at ``flops_token`` model FLOPs each (:func:`flops_per_token`)
    on ``n_gpus`` GPUs, each at ``mfu`` of its bf16 dense datasheet peak ``peak_tflops``:
    ``tokens · flops_token / (n_gpus · peak · mfu)``; ``mfu`` from the calibration (``calibration.run_mfu``,
    as ``time_model.plan_time`` takes it). An estimate from the formula, never a measurement.
    """
    if min(tokens, flops_token, peak_tflops, n_gpus) <= 0 or not 0 < mfu <= 1:
        raise ValueError("training_time_s: tokens, FLOPs, peak and GPUs must be positive, mfu in (0, 1]")
    return tokens * flops_token / (n_gpus * peak_tflops * 1e12 * mfu)
