"""The FSDP1 blocks a fake-tensor dry run cannot see: what ``record_stream`` keeps active on a GPU, read from
the real ``FlatParameter`` units the dry run built.

Chapter "Where the memory goes"; ``smolfsdp.dryrun.run.dry_run`` records it in ``setup`` for FSDP1 runs, and
``smolfsdp dryrun`` prints it. The dry run's tensors are fake ``cpu`` tensors, and FSDP1's
``_no_dispatch_record_stream`` (torch/distributed/fsdp/_common_utils.py) returns at once off cuda/mtia/xpu,
so the traced bytes are allocated bytes, equal for FSDP1 and FSDP2. On a GPU FSDP1 also keeps, in *active*
bytes, one layer's unsharded gradient and one gathered layer past their frees
(``smolfsdp.measure.fsdp1_streams`` says why, from torch's source); this module sizes both from the wrapped
model itself, so the dry run names what it could not trace.

    smolfsdp dryrun --config configs/runs/smollm3_3b_medical.yaml --gpus 2
"""

from __future__ import annotations

from smolfsdp.sharding.fsdp1 import fsdp_units


def record_stream_bytes(model) -> dict[str, int]:
    """Per rank: the largest non-root FSDP1 unit's padded unsharded FlatParameter (its padded shard x ranks)
    x its compute dtype's bytes (``_fwd_bwd_param_dtype``), once as the unsharded gradient (trainable units
    only) and once as the gathered unit. Both 0 for a model with no sharded FSDP1 unit (FSDP2, NO_SHARD, one
    rank). Keys as ``smolfsdp.measure.fsdp1_streams.fsdp1_stream_held``'s."""
    sizes = []
    for unit in fsdp_units(model):
        handle = getattr(unit, "_handle", None)
        if unit is model or handle is None or not handle.uses_sharded_strategy or handle.world_size < 2:
            continue
        numel = (
            handle.flat_param.numel() * handle.world_size
        )  # the padded shard x ranks, before lazy init too
        sizes.append((numel * handle._fwd_bwd_param_dtype.itemsize, handle.flat_param.requires_grad))
    return {
        "unsharded gradient (record_stream)": max((b for b, trains in sizes if trains), default=0),
        "gathered unit (record_stream)": max((b for b, _ in sizes), default=0),
    }
