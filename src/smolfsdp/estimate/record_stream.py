"""FSDP1's ``record_stream`` blocks: what the CUDA caching allocator keeps active past FSDP1's frees.

Sized here from the layout alone (no model build, no GPU) so that ``smolfsdp.estimate.memory`` can add them to
the reserved figure and ``smolfsdp.audit.fsdp1_record_stream`` (which explains them from torch's source) can
compare FSDP1 with FSDP2.

    python -c "from smolfsdp.estimate.record_stream import fsdp1_stream_held as f; print(f('smollm3-3b', world_size=2))"
"""

from __future__ import annotations

from smolfsdp.estimate.layout import sharded_state
from smolfsdp.estimate.params import LoraSpec, model_units, resolve_model_config
from smolfsdp.estimate.recipes import RECIPES, Recipe


def fsdp1_stream_held(
    model,
    *,
    world_size: int,
    recipe: str | Recipe = "hf-fsdp-bf16",
    lora: LoraSpec | None = None,
    adapter_units: bool = False,
) -> dict[str, int]:
    """Bytes per rank FSDP1's ``record_stream`` keeps active at the backward peak, FSDP2 not (``smolfsdp.audit.fsdp1_record_stream`` says why, from torch's source):

    * ``unsharded gradient (record_stream)``: the largest trainable layer unit's unsharded gradient, padded
      FlatParameter numel x the compute dtype's bytes;
    * ``gathered unit (record_stream)``: the largest layer unit gathered, same size.

    0 for both on one rank or ``NO_SHARD`` (no reduce-scatter, no free). ``adapter_units`` (FSDP1 LoRA with each
    adapter its own unit): the frozen base has no gradient, so the gradient block is the largest adapter's.
    Counted in peak active/reserved, not in allocated. Raises what ``resolve_model_config`` raises; KeyError
    for an unknown recipe name."""
    if world_size < 2:
        return {"unsharded gradient (record_stream)": 0, "gathered unit (record_stream)": 0}
    rec = RECIPES[recipe] if isinstance(recipe, str) else recipe
    config = resolve_model_config(model)
    full = sharded_state(config, rec, world_size, 0, 1, lora)["full_units"]
    layers = {k: v for k, v in full.items() if k != "root"}
    grad = max((n for n, trains in layers.values() if trains), default=0)
    if adapter_units:  # the base FlatParameter has no gradient; each adapter matrix is its own unit
        grad = max((p.numel for ps in sharded_units(config, lora) for p in ps if p.trainable), default=0)
    return {
        "unsharded gradient (record_stream)": grad * rec.compute_bytes,
        "gathered unit (record_stream)": max(n for n, _ in layers.values()) * rec.compute_bytes,
    }


def sharded_units(config, lora):
    """The layer units' parameters (``params.model_units`` without the root)."""
    return [ps for k, ps in model_units(config, lora).items() if k != "root"]


def fsdp2_reduce_scatter_kept(
    model, *, world_size: int, recipe: str | Recipe = "hf-fsdp-bf16", lora: LoraSpec | None = None
) -> int:
    """Bytes per rank FSDP2 keeps allocated instead of calling ``record_stream``: the last reduce-scatter input
    (the largest trainable layer's gradients, dim-0 padded, in the reduce dtype: ``recipe.grad_bytes``), held
    in ``comm_ctx.reduce_scatter_states`` until the next layer's post-backward waits on its event
    (``_fully_shard/_fsdp_param_group.py``; ``reduce_scatter_max_input_buffers`` defaults to 1). Alive from
    the first reduce-scatter of a backward on, so not at the ``loss`` moment. 0 on one rank."""
    if world_size < 2:
        return 0
    rec = RECIPES[recipe] if isinstance(recipe, str) else recipe
    sizes = [
        sum(-(-p.dim0 // world_size) * world_size * (p.numel // p.dim0) for p in ps if p.trainable)
        for ps in sharded_units(resolve_model_config(model), lora)
    ]
    return max(sizes, default=0) * rec.grad_bytes
