"""The device peak as it happens: the bytes alive at each moment of a step, and the largest of them.

``smolfsdp.estimate.memory.MemoryEstimate.components_sum_bytes`` adds every component as if all were alive at once
(not a bound: some moments hold tensors no component counts). A step's real peak is the fullest *moment*; the full-size dry run (``smolfsdp.audit.dryrun``) shows
which moments those are for the book's recipes, traced on fake tensors:

* ``loss``: backward has just started. Static state, the gathered root and the layer prefetched for backward,
  every tensor saved for backward (all layers' activations, or under activation checkpointing only each
  layer's input), the logits the step's output object still holds (compute dtype), the fp32 log-softmax the
  loss saved and two fp32 ``tokens x vocab`` gradients (of the loss and of the log-softmax); other loss code
  (torchtitan's, TRL's fused LM head) holds and makes other tensors: ``measure.loss_path``.
* ``layer``: the last decoder layer's backward, with the loss's tensors gone: static state, the gradients of
  the root when it trains (kept unsharded until backward ends; untied, the output layer's and not yet the
  embedding's: ``root_grad.root_grad_before_layers``), the root and two layers gathered, the saved
  tensors, the layer's recomputed activations under checkpointing, its unsharded gradient and reduce-scatter
  input, and the logits still held.
* ``last layer``: the first decoder layer's backward, the last of backward: every other layer's gradient
  shard is held now, the saved tensors are gone but this layer's own (recomputed under checkpointing).
* ``optimizer``: AdamW's step. Parameters, gradients, master copy and m, v, plus what the step's implementation
  makes (``smolfsdp.estimate.adamw_step``): ``foreach`` (the native engine on a GPU) one temporary as large as v
  (``sqrt(v)`` for every parameter at once), ``for-loop`` (native on CPU) one parameter's, ``fused`` (the TRL
  engine: transformers' ``adamw_torch_fused``) none, updating in place.

* ``embedding`` and ``root reduce-scatter`` (when the root trains: ``smolfsdp.estimate.root_grad``), the end of
  backward; ``first layer forward`` (FSDP2: ``smolfsdp.estimate.gather_moment``), the root's all-gather output still
  held. Each is the peak off the SmolLM3-3B grid (short sequences; LoRA on few ranks): ``data/results/dryrun/shapes.json``.

Gradients exist from the first reduce-scatter of a step (``zero_grad(set_to_none=True)``), so the ``loss``
moment of the first micro-batch has none; with gradient accumulation the last micro-batch's has them all.
CUDA context and NCCL buffers are not tensors: stated constants, shown apart (``memory.CUDA_CONTEXT_BYTES``).
``MemoryEstimate.peak_bytes`` is the largest moment plus those constants: what the fit verdicts use.

Checked against the dry run for FULL_SHARD (FSDP1 and FSDP2, full and LoRA, with and without checkpointing,
2048 and 4096 tokens, 2, 4 and 8 ranks: ``data/results/dryrun/grid.json``). SHARD_GRAD_OP (every unit gathered
from its forward to its backward), NO_SHARD (no gathered copy when the replica is the compute copy), FSDP1's
``no_sync`` accumulation (the unsharded gradients held over the micro-batches) and offload (static terms on the
host) follow the same accounting: SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD and FSDP2 offload were traced once at 3B
(within 0.1 %, not in the committed grid); offload and accumulation are held in CI on a scaled-down model
(``tests/test_dryrun.py``); FSDP1's ``no_sync`` is untraced.

    python -c "from smolfsdp.estimate import memory, moments; print(moments.peak_moments(memory.estimate_memory(world_size=2)))"
"""

from __future__ import annotations

from smolfsdp.estimate.activations import activation_breakdown
from smolfsdp.estimate.adamw_step import adamw_temporary_bytes
from smolfsdp.estimate.gather_moment import first_layer_gather_moment
from smolfsdp.estimate.layout import sharded_state
from smolfsdp.estimate.loss_path import with_loss_path
from smolfsdp.estimate.params import LoraSpec, resolve_model_config
from smolfsdp.estimate.recipes import RECIPES
from smolfsdp.estimate.root_grad import root_grad_before_layers, root_gradient_moments
from smolfsdp.estimate.selective_ac_bytes import checkpointed_bytes


def peak_moments(
    est,
    model=None,
    gradient_accumulation_steps: int = 1,
    lora: LoraSpec | None = None,
    adamw: str | None = None,
) -> dict[str, int]:
    """Device bytes alive at the ``loss``, ``layer`` and ``optimizer`` moments of one step, and ``peak`` (their
    largest), for the setup of ``est`` (a :class:`smolfsdp.estimate.memory.MemoryEstimate`). ``model``: the
    model (name or config) ``est`` was made for, when ``est.model`` is not a name ``resolve_model_config`` knows;
    ``lora``: the adapters' ``LoraSpec`` (default ``LoraSpec()`` when ``est.lora``; its dropout adds saved bytes).
    Tensors only: CUDA context and communication buffers are not in any moment. ``adamw``: the AdamW step (one
    of ``adamw_step.ADAMW_IMPLS``: what it adds to the optimizer moment), ``est.adamw`` unless given;
    ConfigError for another."""
    config = resolve_model_config(model if model is not None else est.model)
    rec, spec = RECIPES[est.recipe], ((lora or LoraSpec()) if est.lora else None)
    c, tokens = rec.compute_bytes, est.micro_batch * est.seq_len
    units = est.fsdp_version == 1 and est.lora and not est.base_grads
    st = sharded_state(
        config, rec, est.shard_group, est.rank % est.shard_group, est.fsdp_version, spec, adapter_units=units
    )
    full = st["full_units"]
    root_full, root_trains = full["root"]
    layer_full = max(n for k, (n, _) in full.items() if k != "root")
    act = activation_breakdown(config, tokens, est.seq_len, c, spec, base_grads=est.base_grads)
    # what the loss code holds, saves and makes in backward (transformers', torchtitan's or TRL's: loss_path.py)
    act, lb = with_loss_path(act, config=config, loss_path=est.loss_path, tokens=tokens, compute_bytes=c,
                             legacy_hf_loss=est.loss_fp32_copies > 2)  # fmt: skip
    mode = est.ac_mode if est.activation_checkpointing else None  # full, every k-th layer or op-level
    saved_inputs, recompute = checkpointed_bytes(config, act, tokens, c, mode, est.ac_every, spec)
    saved = saved_inputs + act["head"] + act["rope"] + act["loss"]
    logits_held = lb["held"]  # through the whole backward
    state = est.params_bytes + est.master_bytes + est.optimizer_bytes
    grads_then = est.grads_bytes if gradient_accumulation_steps > 1 else 0
    # FSDP1 accumulating under no_sync(): the unsharded gradients stay from the first micro-batch to the last
    no_sync = est.no_sync_grads_bytes
    copies = est.gathered_bytes > 0  # a replica in the compute dtype already is its compute copy
    gathered_root = root_full * c if copies else 0
    unit = layer_full * c if copies else 0
    # SHARD_GRAD_OP keeps every unit gathered from its forward to its backward (est.gathered_bytes: all units)
    sgo = est.strategy == "SHARD_GRAD_OP"
    loss_units = est.gathered_bytes if sgo else gathered_root + unit
    layer_units = est.gathered_bytes if sgo else gathered_root + 2 * unit
    # the root's gradient the layers' backward sees (untied: the output layer's, the embedding's comes last)
    root_grad = root_grad_before_layers(config, root_full, root_trains, c)
    loss = state + grads_then + no_sync + loss_units + saved + logits_held + lb["backward"]
    layer = (
        state + grads_then + no_sync + root_grad + layer_units + saved - act["loss"] + recompute
        + est.grad_buffer_bytes + logits_held
    )  # fmt: skip
    # the first layer of the model, last in backward: every other layer's gradient shard is held by now, and
    # no layer is left to prefetch
    last_layer = (
        state + est.grads_bytes + no_sync + root_grad + gathered_root + unit + act["per_layer"]
        + est.grad_buffer_bytes + logits_held
    )  # fmt: skip
    # the step's own temporaries (none on the device when the state is offloaded: the step runs on the host)
    shards = [] if est.offload else st["optimizer_shards"]
    temporary = adamw_temporary_bytes(adamw or est.adamw, shards, rec.state_bytes)
    optimizer = state + est.grads_bytes + temporary
    moments = {"loss": loss, "layer": layer, "last layer": last_layer, "optimizer": optimizer}
    # the end of backward, when the root trains: its gradient (root_grad.py says what each moment holds)
    moments.update(root_gradient_moments(est, config, rec, full, state + no_sync + logits_held, gathered_root,
                                         gradient_accumulation_steps, spec))  # fmt: skip
    # FSDP2's first layer forward, the root's all-gather output still held (gather_moment.py says what it holds)
    moments.update(first_layer_gather_moment(est, config, c, state + grads_then + no_sync, gathered_root, unit,
                                             tokens, act["rope"]))  # fmt: skip
    return {**moments, "peak": max(moments.values())}
