"""The end of backward: the root unit's gradient (embedding and output layer), two moments of a step.

``smolfsdp.estimate.moments.peak_moments`` adds these to its ``loss``, ``layer``, ``last layer`` and ``optimizer``
moments when the root trains (a full fine-tune; under LoRA the root is frozen and has no gradient). They are the
peak where the vocabulary is large beside the rest of a rank's share: short sequences and many ranks (Qwen2.5-1.5B,
151,936 x 1,536 embedding, on 8 ranks at 2 x 128 tokens: 12 % above the ``last layer`` moment). Found by the
full-size dry run (``smolfsdp.audit.dryrun``) and checked there on real CPU tensors (``dry_run(fake=False)``: the same
bytes as on fake tensors):

* ``embedding``: the embedding's backward, the last op of backward, with the root still gathered. The output layer's
  weight gradient (``[V, h]``, compute dtype) has been held since backward began; the embedding's own is made now.
  Untied, each is its parameter's gradient (together: the root's gradient). Tied (``tie_word_embeddings``: SmolLM3,
  Qwen2.5, Llama 3.2), both flow to one weight and autograd adds them out of place (``aten::add``, not ``add_``:
  torch/csrc/autograd/input_buffer.cpp ``accumulate``; seen on plain CPU tensors in the profiler, device-independent
  code): the two and their sum, three ``[V, h]`` tensors at once. FSDP2 still holds the last decoder layer's
  reduce-scatter input (fp32): ``_fsdp_param_group.py`` ``post_backward`` keeps it in ``reduce_scatter_states``
  (line 716) until the next group's reduce.
  While the decoder layers run backward, only the output layer's (and the final norm's) gradient exists:
  untied, the embedding's is not made yet (``root_grad_before_layers``, the ``layer`` and ``last layer`` moments;
  the Llama 3.1 8B dry run, 8 ranks at 2 x 128, showed a ``last layer`` moment that counted it above the traced
  peak).
* ``root reduce-scatter``: the root's post-backward, after the root is resharded. FSDP2 copies the unsharded
  gradients into a reduce-dtype buffer before freeing them (``_fsdp_collectives.py`` ``foreach_reduce``, lines 597,
  603, 606): compute + reduce bytes per element. FSDP1 casts the unsharded ``FlatParameter`` gradient to the reduce
  dtype while the compute-dtype one is still referenced (``_runtime_utils.py`` ``_post_backward_hook`` line 764),
  then allocates the new gradient shard (``_get_reduce_scatter_tensors``, line 901): one more shard.

Both hold every decoder layer's gradient shard; the root's own shard only when an earlier micro-batch made it.

    python -c "from smolfsdp.measure import memory; print(memory.estimate_memory('data/models/qwen2_5_1_5b', world_size=8, seq_len=128, micro_batch=2, activation_checkpointing=True).moments)"
"""

from __future__ import annotations

from smolfsdp.estimate.layout import dim0_layout, flat_layout
from smolfsdp.estimate.params import model_units
from smolfsdp.estimate.recipes import Recipe


def root_grad_shard_bytes(config, rec: Recipe, group: int, rank: int, fsdp_version: int, spec=None) -> int:
    """Bytes of this rank's gradient shard of the root unit (FSDP1: its ``FlatParameter`` shard when it holds a
    trainable parameter; FSDP2: each trainable root parameter's padded ``Shard(0)`` rows)."""
    root = model_units(config, spec)["root"]
    if not any(p.trainable for p in root):
        return 0
    if fsdp_version == 1:
        return flat_layout(root, group, rank, 16 // rec.compute_bytes)[0] * rec.grad_bytes
    return sum(dim0_layout(p, group, rank)[0] for p in root if p.trainable) * rec.grad_bytes


def root_grad_before_layers(config, root_full: int, root_trains: bool, compute_bytes: int) -> int:
    """Bytes of the root's unsharded gradient alive while the decoder layers run backward (the ``layer`` and
    ``last layer`` moments): what backward made before reaching them, the output layer's and the final norm's.
    Tied, that is the one shared weight's gradient (``root_full``); untied (Llama 3.1 8B), the embedding's own
    gradient is made only at the end (``embedding`` moment), so its ``[V, h]`` is not there yet. ``root_full``:
    the root unit's full (padded) numel."""
    if not root_trains:
        return 0
    untied_embedding = (
        0 if getattr(config, "tie_word_embeddings", False) else config.vocab_size * config.hidden_size
    )
    return (root_full - untied_embedding) * compute_bytes


def root_gradient_moments(est, config, rec: Recipe, full: dict, base: int, gathered_root: int, steps: int,
                          spec=None) -> dict[str, int]:  # fmt: skip
    """Bytes alive at the ``embedding`` and ``root reduce-scatter`` moments (module docstring), or ``{}`` when
    the root is frozen. ``full``: ``sharded_state``'s ``full_units``; ``base``: what every moment of the step
    holds here (parameters, master copy, optimizer state, FSDP1 ``no_sync`` gradients, the logits the output
    still holds); ``gathered_root``: the root's compute copy (0 when the replica is its compute copy);
    ``steps``: gradient accumulation steps (> 1: the root's gradient shard already exists)."""
    root_full, root_trains = full["root"]
    if not root_trains:
        return {}
    c = rec.compute_bytes
    own = root_grad_shard_bytes(
        config, rec, est.shard_group, est.rank % est.shard_group, est.fsdp_version, spec
    )
    shards = est.grads_bytes - (own if steps == 1 else 0)
    vocab_weight = config.vocab_size * config.hidden_size
    tied_sum = 2 * vocab_weight * c if getattr(config, "tie_word_embeddings", False) else 0
    layer_rs = 0
    if est.fsdp_version == 2:  # the last layer's reduce-scatter input, still referenced
        layer_rs = max((n for k, (n, t) in full.items() if t and k != "root"), default=0) * rec.grad_bytes
    embedding = base + shards + gathered_root + root_full * c + tied_sum + layer_rs
    new_shard = own if est.fsdp_version == 1 else 0
    reduce = base + shards + root_full * (c + rec.grad_bytes) + new_shard
    return {"embedding": embedding, "root reduce-scatter": reduce}
