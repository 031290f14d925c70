"""The FSDP1 blocks a fake-tensor dry run cannot see: what ``record_stream`` keeps active on a GPU, read from
the real ``FlatParameter`` units the dry run built.

Appendix "How the estimates are checked"; ``smolfsdp.audit.dryrun.dry_run.dry_run`` records it in ``setup`` for FSDP1 runs, and
``smolfsdp dryrun`` prints it. The dry run's tensors are fake ``cpu`` tensors, and FSDP1's
``_no_dispatch_record_stream`` (torch/distributed/fsdp/_common_utils.py) returns at once off cuda/mtia/xpu,
so the traced bytes are allocated bytes, equal for FSDP1 and FSDP2. On a GPU FSDP1 also keeps, in *active*
bytes, one layer's unsharded gradient and one gathered layer past their frees
(``smolfsdp.estimate.record_stream`` says why, from torch's source); this module sizes both from the wrapped
model itself, so the dry run names what it could not trace.

    smolfsdp dryrun --config configs/runs/smollm3_3b_medical.yaml --gpus 2
"""

from __future__ import annotations

from contextlib import contextmanager

import torch.distributed.fsdp._flat_param as flat_param_mod
from torch.distributed.fsdp import _runtime_utils as fsdp_runtime
from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

from smolfsdp.sharding.fsdp1 import fsdp_units


def record_stream_bytes(model) -> dict[str, int]:
    """Per rank: the largest non-root FSDP1 unit's padded unsharded FlatParameter (its padded shard x ranks)
    x its compute dtype's bytes (``_fwd_bwd_param_dtype``), once as the unsharded gradient (trainable units
    only) and once as the gathered unit. Both 0 for a model with no sharded FSDP1 unit (FSDP2, NO_SHARD, one
    rank). Keys as ``smolfsdp.estimate.record_stream.fsdp1_stream_held``'s."""
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


@contextmanager
def allocator_trace(tracker):
    """While active, the tracker's allocation order (``tracker.alloc_events``) also says what a GPU's caching
    allocator would see besides sizes, for ``smolfsdp.audit.allocator_replay.replay``:

    * the stream of each allocation: FSDP1 and FSDP2 open ``device_handle.stream(...)`` around their unshard,
      all-gather and reduce-scatter work; on the CPU ``torch.cpu.stream`` only sets ``torch.cpu``'s current
      stream, which the tracker reads at each allocation (0: the default stream, 1, 2, ... in order of first
      use). A block freed on one stream's pool is reused only by that stream on a GPU.
    * FSDP1's ``record_stream`` calls (``_no_dispatch_record_stream``, torch/distributed/fsdp/_common_utils.py,
      a no-op off cuda): ``("r", id, stream)``; on a GPU such a block is freed only when that stream's work
      queued so far is done.
    * FSDP1's and FSDP2's lazy initialisation in the first forward, between ``("lazy", 1)`` and ``("lazy", 0)``
      (once per run, so the replay's later steps skip it).

    torch's own functions run unchanged; only these two are wrapped, only inside the dry run."""
    original_record = fsdp_runtime._no_dispatch_record_stream
    original_lazy1, original_lazy2 = fsdp_runtime._lazy_init, FSDPState._lazy_init

    def record(tensor, stream) -> None:
        tracker.record_stream(tensor, stream)
        original_record(tensor, stream)

    def in_lazy_phase(fn, uninitialised):
        def wrapped(*args, **kwargs):
            if not uninitialised(args[0]):
                return fn(*args, **kwargs)
            tracker.alloc_events.append(("lazy", 1))
            try:
                return fn(*args, **kwargs)
            finally:
                tracker.alloc_events.append(("lazy", 0))

        return wrapped

    fsdp_runtime._no_dispatch_record_stream = flat_param_mod._no_dispatch_record_stream = record
    fsdp_runtime._lazy_init = in_lazy_phase(original_lazy1, lambda state: state._is_root is None)
    FSDPState._lazy_init = in_lazy_phase(original_lazy2, lambda state: state._is_root is None)
    try:
        yield
    finally:
        fsdp_runtime._no_dispatch_record_stream = flat_param_mod._no_dispatch_record_stream = original_record
        fsdp_runtime._lazy_init, FSDPState._lazy_init = original_lazy1, original_lazy2
