"""The first decoder layer's forward under FSDP2: the root's all-gather output still held (a moment of a step).

``smolfsdp.estimate.moments.peak_moments`` adds it for FSDP2 when parameters are gathered. It is the peak where
little else is alive: LoRA (no gradients, few saved tensors) on few ranks at short sequences (Llama 3.2 1B, LoRA on
2 ranks at 2 x 128 tokens: 4.5 % above the ``loss`` moment; SmolLM3-3B the same: 2.4 %). Found by the full-size dry
run (``data/results/dryrun/shapes.json``). What it holds, on rank 0 as traced:

* the parameter shards, master copy and optimizer state, and any gradient shards of earlier micro-batches;
* the root gathered (compute dtype) and its all-gather output, which FSDP2 keeps in forward "to free after the next
  copy-out" (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``wait_for_unshard``, lines 419-432 and
  483: ``AllGatherState``), so it is alive when the first layer's all-gather output is allocated;
* the first layer's all-gather output and one more tensor of the same size, traced as an activation (the layer's
  unsharded parameters made by the copy-out; that the root's output is still held then, after line 432 frees the
  previous state, is what the trace shows and is not yet explained from the source: held to the trace, within
  1 KiB on both rows above, not checked on a GPU);
* the embedding's output and RoPE's cos/sin.
"""

from __future__ import annotations


def first_layer_gather_moment(est, config, c: int, base: int, gathered_root: int, unit: int, tokens: int,
                              rope: int) -> dict[str, int]:  # fmt: skip
    """``{"first layer forward": bytes}`` for FSDP2 with gathered parameters (``gathered_root`` and ``unit``, the
    root's and one layer's compute copy, > 0), else ``{}``. ``c``: compute bytes per element; ``base``: parameters,
    master copy, optimizer state and gradient shards held as the step begins; ``tokens``: micro-batch x sequence;
    ``rope``: cos and sin bytes."""
    if est.fsdp_version != 2 or not gathered_root or not unit:
        return {}
    return {
        "first layer forward": base + 2 * gathered_root + 2 * unit + tokens * config.hidden_size * c + rope
    }
