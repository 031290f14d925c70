"""FSDP1's ``record_stream`` blocks: what the CUDA caching allocator keeps active past FSDP1's frees, and why FSDP2 has none.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``) and issue 31. Read from torch's own source
(``torch/distributed/fsdp/``, the version in ``constraints.txt``), item by item, for a full fine-tune:

* **Flat-parameter padding** (``_flat_param.py``, ``_init_flat_param_and_metadata``): each parameter starts at
  a multiple of 16 bytes and the unit is padded to a multiple of the world size. FSDP2 pads each parameter's
  dim 0 instead. Both are exact in ``smolfsdp.estimate.layout``; for transformer shapes the difference is a few
  bytes (``fsdp1_minus_fsdp2``'s ``padding and layout``).
* **The unsharded flat gradient** (``_runtime_utils._post_backward_hook`` / ``_reduce_grad``): the unit's
  whole gradient in the compute dtype, cast to ``reduce_dtype`` (fp32) and reduce-scattered into a padded
  fp32 shard. FSDP2's ``foreach_reduce`` holds the same: per-parameter bf16 gradients copied into one fp32
  reduce-scatter input. Same bytes in both (``MemoryEstimate.grad_buffer_bytes``).
* **``_flat_param`` views** (``use_orig_params=True``): the original parameters are views into the flat
  parameter (``_use_unsharded_views``): no storage of their own, 0 bytes.
* **The root unit**: neither reshards it after forward (FSDP1 ``_post_forward_reshard``: ``not
  state._is_root``; FSDP2 ``FSDPState._lazy_init``: the root's ``post_forward_mesh_info = None``); counted in
  both.
* **fp32 vs bf16**: both keep fp32 shards, gather bf16, reduce in fp32 and keep fp32 sharded gradients
  (FSDP1 ``_cast_grad_to_param_dtype``), so nothing differs in dtype.
* **What differs: ``record_stream``.** FSDP1 frees two per-unit tensors with ``_no_dispatch_record_stream``:
  the unsharded gradient autograd produced on the compute stream, recorded on the post-backward stream
  (``_post_backward_hook``: "inform the caching allocator"), and the gathered flat parameter, recorded on the
  compute stream (``FlatParamHandle._free_unsharded_flat_param``: "Do not free the memory until all ops in
  the current stream finish"). The CUDA caching allocator lowers ``allocated_bytes`` at the free but keeps
  the block *active* (not reusable) until the recorded stream has passed (``CUDACachingAllocator``
  ``free`` -> ``insert_events``); the CPU runs ahead of the GPU, so the next unit's gradient and all-gather
  take new blocks. FSDP2 has no ``record_stream`` (``_fully_shard.py``: "there is no extra stream and no
  ``record_stream``"; stream-to-stream waits instead). So at the backward peak FSDP1 holds, in *active*
  and *reserved* bytes, one more layer's unsharded gradient and one more gathered layer, both in the compute
  dtype: :func:`fsdp1_stream_held`. Not in ``max_memory_allocated``.

Sized here from the layout alone (no model build, no GPU) so that ``smolfsdp.estimate.memory`` can add them to
the reserved figure. Why the dry run shows FSDP1 and FSDP2 equal: it runs FSDP1 for real (``FlatParameter`` units, torch's
``MemTracker``) but on fake tensors of device ``cpu``, and ``_no_dispatch_record_stream``
(``torch/distributed/fsdp/_common_utils.py``) returns at once for a device that is not cuda/mtia/xpu: the
dry run's live tensor bytes are what ``max_memory_allocated`` would count, where the two versions agree.

FSDP2 has its own lifetime extension, in *allocated* bytes: instead of ``record_stream`` it keeps the last
reduce-scatter input (one layer's gradients in the reduce dtype) referenced until the next layer's
post-backward (``_fsdp_param_group.py``, ``reduce_scatter_states``). The dry run sees it: the Qwen2.5-1.5B shape
on 8 fake ranks at 2 x 128 tokens, FSDP2's peak (at the end of backward) is 5,110,061,140 bytes and FSDP1's
4,922,869,844, FSDP2 higher by 187,191,296 = 46,797,824 layer parameters x 4 (fp32 reduce); the estimator's
end-of-backward moments (``smolfsdp.estimate.root_grad``) hold it there, its ``layer`` moment does not (both
versions 4,539,798,784), so ``fsdp1_minus_fsdp2`` takes it off that moment only. With fp32 reduction it is as large as
FSDP1's two bf16 record_stream blocks, so during a layer's backward the active totals cancel; at the ``loss``
moment (no reduce-scatter yet) FSDP1's blocks stand alone.

``smolfsdp.audit.published_rows.fsdp1_minus_fsdp2`` holds the difference to the one published FSDP1/FSDP2 pair;
``smolfsdp.audit.dryrun.streams`` counts these blocks on the real ``FlatParameter`` units a dry run builds.

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
    """Bytes per rank FSDP1's ``record_stream`` keeps active at the backward peak, FSDP2 not (the module docstring says why, from torch's source):

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
