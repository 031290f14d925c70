"""What FSDP1 holds that FSDP2 does not: the blocks its ``record_stream`` calls keep busy after a free.

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

Why the dry run shows FSDP1 and FSDP2 equal: it runs FSDP1 for real (``FlatParameter`` units, torch's
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

Held to the one published FSDP1/FSDP2 pair found (:data:`TORCHTITAN_PR165`); accelerate's benchmark
(``benchmarks/fsdp2/``) compares FSDP2 set-ups only (optimizer created before/after ``fully_shard``), no FSDP1.

    python -c "from smolfsdp.audit.fsdp1_record_stream import fsdp1_minus_fsdp2 as d; print(d('smollm3-3b', world_size=2))"
"""

from __future__ import annotations

from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import LoraSpec
from smolfsdp.estimate.record_stream import fsdp1_stream_held, fsdp2_reduce_scatter_kept

__all__ = ["TORCHTITAN_PR165", "fsdp1_minus_fsdp2", "fsdp1_stream_held", "published_difference_gib"]

#: The published FSDP1-vs-FSDP2 pair: pytorch/torchtitan commit 83c879f18763611bda68586c45f0082fd568d646
#: ("Used per-parameter FSDP (#165)", Andrew Gu, 2024-03-28), its message: "1k steps of minipile on 8 H100
#: GPUs, local batch size 8, sequence length 2048, AC/SAC, bf16 mixed precision, fp32 reduce-scatter";
#: peak *active* memory in % of 95.0396 GiB. The parent commit's ``parallelize_llama.py``: FSDP1 FULL_SHARD,
#: ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)``, ``BACKWARD_PRE``, ``use_orig_params=True``, each
#: ``TransformerBlock`` then the root wrapped; ``train_configs/llama_7b.toml``: the 7B flavour (dim 4096,
#: 32 layers, FFN 11008, 32,000-token vocabulary: ``data/models/llama2_7b``).
TORCHTITAN_PR165 = {
    "model": "data/models/llama2_7b",
    "world_size": 8,
    "seq_len": 2048,
    "micro_batch": 8,
    "gpu_gib": 95.0396,
    "peak_active_pct": {"AC": {"fsdp1": 24.81, "fsdp2": 23.92}, "SAC": {"fsdp1": 52.98, "fsdp2": 52.13}},
}


def published_difference_gib(ac: str = "AC") -> float:
    """FSDP1 - FSDP2 peak active GiB of :data:`TORCHTITAN_PR165` (``ac``: "AC" or "SAC")."""
    pct = TORCHTITAN_PR165["peak_active_pct"][ac]
    return (pct["fsdp1"] - pct["fsdp2"]) / 100 * TORCHTITAN_PR165["gpu_gib"]


def fsdp1_minus_fsdp2(model, *, world_size: int, **kwargs) -> dict[str, int]:
    """FSDP1 - FSDP2 bytes per rank at the step's peak, by component, for ``estimate_memory(model,
    world_size=..., **kwargs)`` (FULL_SHARD unless ``strategy`` says otherwise):

    * ``padding and layout``: the estimator's tensor peak (``moments``), FSDP1 minus FSDP2 (exact padding);
    * the two :func:`fsdp1_stream_held` blocks (FSDP1 holds them, active only);
    * ``FSDP2 reduce-scatter input kept``: ``record_stream.fsdp2_reduce_scatter_kept`` (FSDP2 holds it,
      allocated and active, from the first reduce-scatter of a backward on);
    * totals at the ``loss`` moment (no reduce-scatter yet) and during a layer's backward, ``allocated`` (what
      ``max_memory_allocated`` and the dry run see) and ``active`` (``memory_stats()["active_bytes.all.peak"]``,
      torchtitan's counter);
    * ``allocated, at the peaks``: the two estimates' peak moments, FSDP1 minus FSDP2 (what two dry runs'
      peaks differ by)."""
    one, two = (estimate_memory(model, world_size=world_size, fsdp_version=v, **kwargs) for v in (1, 2))
    # per moment: the estimator's own end-of-backward moments (``measure.root_grad``) already hold FSDP2's kept
    # root reduce-scatter input where it is the peak, so the kept layer input is taken off the layer moment only
    layout = one.moments["loss"] - two.moments["loss"]
    layer = one.moments["layer"] - two.moments["layer"]
    strategy = kwargs.get("strategy", "FULL_SHARD")
    group = 1 if strategy == "NO_SHARD" else one.shard_group
    lora = LoraSpec() if kwargs.get("lora") is True else (kwargs.get("lora") or None)
    held = fsdp1_stream_held(model, world_size=group, recipe=kwargs.get("recipe", "hf-fsdp-bf16"), lora=lora)
    kept = fsdp2_reduce_scatter_kept(
        model, world_size=group, recipe=kwargs.get("recipe", "hf-fsdp-bf16"), lora=lora
    )
    return {
        "padding and layout": layout, **held, "FSDP2 reduce-scatter input kept": kept,
        "allocated, loss moment": layout, "active, loss moment": layout + sum(held.values()),
        "allocated, layer backward": layer - kept, "active, layer backward": layer + sum(held.values()) - kept,
        "allocated, at the peaks": one.moments[one.peak_moment] - two.moments[two.peak_moment],
    }  # fmt: skip
