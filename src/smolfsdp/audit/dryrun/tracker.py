"""Counting one dry-run step: memory by category and the moment of the peak, collectives, memory over time.

PyTorch's trackers do the counting (``torch.distributed._tools``): ``FSDPMemTracker`` for FSDP2 (memory by
category: sharded/unsharded parameters, gradients, optimizer state, activations, temporaries, all-gather and
reduce-scatter buffers), ``MemTracker`` for FSDP1 (parameters, gradients, optimizer state, activations,
temporaries). :func:`moment_tracker` adds what they do not keep: *when* the peak happened (phase and
innermost module), every collective with its bytes, and the total after each module's forward and backward
(the series a figure draws). Used by ``smolfsdp.audit.dryrun.dry_run``.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._guards import active_fake_mode
from torch.cpu import current_stream
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.fsdp import _runtime_utils as fsdp_runtime
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.nn import functional as F
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

_TOTAL = "Total"
aten = torch.ops.aten
c10d = torch.ops.c10d
fc = torch.ops._c10d_functional
#: (op, kind, which argument holds the full tensor): all-gather output, reduce-scatter input, all-reduce buffer.
COLLECTIVES = {
    c10d._allgather_base_.default: ("all-gather", 0),
    # FSDP1 falls back to the list all-gather when the backend lacks all_gather_into_tensor (gloo, the fake
    # group); on NCCL it is _allgather_base_: the same bytes
    c10d.allgather_.default: ("all-gather", 0),
    c10d.allgather_into_tensor_coalesced_.default: ("all-gather", 0),
    c10d._reduce_scatter_base_.default: ("reduce-scatter", 1),
    c10d.reduce_scatter_tensor_coalesced_.default: ("reduce-scatter", 1),
    c10d.allreduce_.default: ("all-reduce", 0),
    fc.all_reduce.default: ("all-reduce", 0),
    fc.all_gather_into_tensor.default: ("all-gather", -1),
    fc.reduce_scatter_tensor.default: ("reduce-scatter", 0),
}


_PROPAGATING = [0]


@contextmanager
def untracked_sharding_propagation():
    """While active, the tensors DTensor's sharding propagation builds are not counted as memory.

    Why (torch 2.13): to learn an op's output shape, ``ShardingPropagator`` runs the op on fake tensors of the
    *global* shape (``_propagate_tensor_meta_non_cached``). In eager mode it makes its own ``FakeTensorMode``,
    which the trackers skip; inside the dry run's fake mode it reuses that mode, so the trackers would count
    unsharded, gradient-sized tensors that a real run never allocates (seen in ``clip_grad_norm_`` and in the
    first AdamW step: several times the shard size). This wrapper marks those calls; nothing else changes.
    """
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def marked(self, *args, **kwargs):
        _PROPAGATING[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _PROPAGATING[0] -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = marked
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextmanager
def fake_data_pointer_quiet():
    """Filter torch's "Accessing the data pointer of FakeTensor is deprecated ... almost definitely a bug in
    your code" while the dry run runs. torch's own FSDP1 (``_runtime_utils._catch_all_reshard``) reads
    ``flat_param.data_ptr()``; on fake tensors every pointer is 0, which :func:`fsdp1_reshard_by_storage` and
    ``smolfsdp.sharding.shards.storage_bytes`` (storage identity, not pointers) already allow for, so the
    warning says nothing about the traced run. Two more messages torch's trackers cause, said below; only these,
    only inside the dry run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor is deprecated")
        # torch's memory trackers put full backward hooks on every module; under LoRA the frozen embedding's
        # output needs no gradient, so torch says the hook fires on outputs: true, and what the tracker wants
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
        # MemTracker (torch 2.13 mem_tracker.py line 594) reads ``param.grad`` of every ``module.parameters()``;
        # FSDP1 with use_orig_params exposes the original parameters as views of its FlatParameter (non-leaf),
        # whose .grad is None: torch warns that it will never be filled. The FlatParameter's gradient, what the
        # tracker counts, is read apart (it is a leaf); nothing traced is lost
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf Tensor")
        yield


@contextmanager
def fsdp1_reshard_by_storage():
    """While active, FSDP1's end-of-backward catch-all reshard tells a resharded ``FlatParameter`` by its storage.

    Why (torch 2.13): ``_runtime_utils._catch_all_reshard`` skips a handle whose ``flat_param.data_ptr()`` equals
    its ``_local_shard.data_ptr()`` ("already resharded"). Every fake tensor's ``data_ptr()`` is 0, so in the dry run
    it skipped every handle, and a frozen unit that no post-backward hook reshards (the root under LoRA) stayed
    gathered after the step, which a GPU run never does. The check here compares the storages themselves;
    the rest is torch's own code.
    """
    original = fsdp_runtime._catch_all_reshard

    def by_storage(state) -> None:
        handle = state._handle
        if handle is None:
            return
        resharded = (
            handle.flat_param.untyped_storage()._cdata
            == handle.flat_param._local_shard.untyped_storage()._cdata
        )
        if resharded and not handle._skipped_use_sharded_views:
            return
        fsdp_runtime._reshard(state, handle, fsdp_runtime._should_free_in_backward(state, handle))

    fsdp_runtime._catch_all_reshard = by_storage
    try:
        yield
    finally:
        fsdp_runtime._catch_all_reshard = original


@contextmanager
def cuda_dropout():
    """While active, ``torch.nn.functional.dropout`` in training takes the fused ``native_dropout``, as on CUDA.

    Why (torch 2.13): ``at::dropout`` (aten/src/ATen/native/Dropout.cpp) calls the fused ``native_dropout``
    only when ``is_fused_kernel_acceptable``: the input on CUDA (or XPU, lazy, PrivateUse1) and ``0 < p < 1``.
    Elsewhere, CPU included, it multiplies by a noise tensor of the input's dtype, which backward keeps: 2 bytes
    per element in bf16 where CUDA keeps a 1-byte bool mask. The dry run runs on the CPU and traces what a GPU
    keeps, so it takes CUDA's path (LoRA's adapter dropout is the one dropout the book's recipes train with).
    """
    original = F.dropout

    def fused(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    F.dropout = fused
    try:
        yield
    finally:
        F.dropout = original


def count_flops(func, args, kwargs, out) -> int:
    """FLOPs of one op by torch's own formulas (``torch.utils.flop_counter.flop_registry``); the CPU
    flash-attention op (forward and backward), which that registry leaves out, by its SDPA formulas."""
    packet = func._overloadpacket
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **(kwargs or {}), out_val=out))
    if packet is aten._scaled_dot_product_flash_attention_for_cpu:
        return sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape)
    if packet is aten._scaled_dot_product_flash_attention_for_cpu_backward:
        return sdpa_backward_flop_count(args[0].shape, args[1].shape, args[2].shape, args[3].shape)
    return 0


def _nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


class _MomentMixin:
    """Keeps the phase and innermost module of the peak, the collectives, and a memory series."""

    def _moment_init(self) -> None:
        self.__dict__.setdefault("alloc_events", [])
        self._stream_id(current_stream())
        self.phase = "setup"
        self.flops: dict[str, int] = defaultdict(int)
        self.peak_moment: dict[str, Any] = {}
        self.collectives: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.series: list[dict[str, Any]] = []
        # with offload, the categories the host holds; the device peak is the total without them
        self.host_categories: frozenset = frozenset()
        self.device_peak, self.device_peak_moment = 0, {}

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        self.alloc_events.append(("p", value))

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        """The trackers' own bookkeeping, and the allocation order for ``smolfsdp.audit.allocator_replay.replay``:
        ``("a", id, bytes, category, stream)`` when a storage is allocated (or resized up from 0), ``("f", id)``
        when it is freed (or resized to 0), a resize as a free then an allocation (FSDP's unshard and reshard),
        ``("c", id, category)`` when the trackers re-label a storage (an output that became a gradient)."""
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        events = self.__dict__.setdefault("alloc_events", [])
        kind = u_type.name
        sid = winfo.__dict__.get("sim_id")
        if sid is None:
            sid = winfo.sim_id = len(events)
        if kind == "REF":  # the storage changed category (an output became a gradient): its final use
            events.append(("c", sid, winfo.reftype.name))
            return
        if kind in ("DEL", "SIZE") and (old_mem_consumed if kind == "SIZE" else winfo.mem_consumed):
            events.append(("f", sid))
        if kind in ("ADD", "SIZE") and winfo.mem_consumed:
            events.append(
                ("a", sid, winfo.mem_consumed, winfo.reftype.name, self._stream_id(current_stream()))
            )

    def _stream_id(self, stream) -> int:
        """0 for the default stream (current when the tracker is made: outside any stream context), then 1, 2,
        ... in order of first use (``dryrun.streams.allocator_trace``)."""
        ids = self.__dict__.setdefault("stream_ids", {id(current_stream()): 0})
        return ids.setdefault(id(stream), len(ids))

    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        """FSDP1 called ``record_stream(tensor, stream)``: ``("r", id, stream)`` for the replay."""
        winfo, _ = self._WINFO.get(tensor.untyped_storage(), (None, None))
        if winfo is not None and "sim_id" in winfo.__dict__:
            self.alloc_events.append(("r", winfo.sim_id, self._stream_id(stream)))

    def current_bytes(self) -> int:
        snap = self.get_tracker_snapshot("current")
        return sum(dev.get(_TOTAL, 0) for dev in snap.values())

    def mark(self, event: str, module: str = "") -> None:
        """One point of the memory series: the total now, after ``event`` of ``module``."""
        self.series.append({"i": len(self.series), "phase": self.phase, "module": module, "event": event,
                            "bytes": self.current_bytes()})  # fmt: skip

    def _update_peak_stats(self, peak_state) -> None:
        """The global peak and its moment only. Why not ``MemTracker``'s own: on every allocation it also
        walks every tracked module to update the per-module peaks of the active ones, which the dry run never
        reads; with LoRA's thousand-odd modules that walk was most of an FSDP1 dry run's time. The global peak
        and its snapshot are updated exactly as ``MemTracker._update_peak_stats`` does (torch 2.13)."""
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL]:
                self._peak_mem[dev] = dev_snap[_TOTAL]
                self._peak_mem_snap[dev] = dict(dev_snap)
                self.peak_moment = self._moment()
            device = dev_snap[_TOTAL] - sum(dev_snap.get(c, 0) for c in self.host_categories)
            if self.host_categories and device > self.device_peak:
                self.device_peak, self.device_peak_moment = device, self._moment()

    def _moment(self) -> dict[str, str]:
        parents = [p for p in self._mod_tracker.parents if p != "Global"]
        return {"phase": self.phase, "module": max(parents, key=len, default="(none)")}

    def offload(self) -> None:
        """The run offloads: parameter shards, their gradients and the optimizer state live on the host (FSDP2
        ``CPUOffloadPolicy``, FSDP1 ``CPUOffload(offload_params=True)``), so the device peak leaves them out."""
        self.host_categories = self.HOST_CATEGORIES

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _PROPAGATING[0]:  # shape propagation of a DTensor op: no memory, no FLOPs, no collective
            return func(*args, **(kwargs or {}))
        out = super().__torch_dispatch__(func, types, args, kwargs)
        # only ops on local tensors (a DTensor op is counted as the local ops it turns into) and not the
        # shape propagation DTensor runs under a nested fake mode (the trackers skip those the same way)
        if out is NotImplemented or active_fake_mode() is not self._fake_mode_on_entry:
            return out
        spec = COLLECTIVES.get(func)
        if spec is not None:
            kind, arg = spec
            entry = self.collectives[(self.phase, kind)]
            entry[0] += 1
            entry[1] += _nbytes(args[arg]) if arg >= 0 else 0
        # counted here rather than with FlopCounterMode: its module tracker keeps every tensor that activation
        # checkpointing recomputes alive until the step ends (seen on torch 2.13), which would distort the memory
        self.flops[self.phase] += count_flops(func, args, kwargs, out)
        return out


class FSDP2Tracker(_MomentMixin, FSDPMemTracker):
    """``FSDPMemTracker`` plus the peak's moment, collectives and a memory series."""

    HOST_CATEGORIES = frozenset({_FSDPRefType.SHARDED_PARAM, _FSDPRefType.SHARDED_GRAD, _FSDPRefType.OPT})

    def __init__(self, mod: nn.Module, optm=None):
        super().__init__(mod, optm)
        self._moment_init()


class ModuleTracker(_MomentMixin, MemTracker):
    """``MemTracker`` (any module; FSDP1 here) plus the peak's moment, collectives and a memory series.

    Why the override: ``MemTracker`` refuses a module whose forward runs twice in one iteration outside
    backward. With FSDP1 and activation checkpointing its module tracker does not always see the recompute
    as backward (FSDP1's own hooks run first), so we treat a repeated forward as the recompute it is.
    """

    HOST_CATEGORIES = frozenset({_MemRefType.PARAM, _MemRefType.GRAD, _MemRefType.OPT})

    def __init__(self, mod: nn.Module, optm=None):
        super().__init__()
        self.track_external(mod, *([optm] if optm is not None else []))
        self._moment_init()

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True):
        """``MemTracker``'s own, except that gradient hooks go on leaf parameters only: under FSDP1 with
        ``use_orig_params`` the original parameters are views into the FlatParameter during forward
        (torch refuses a post-accumulate-grad hook on them); the FlatParameters are the leaves."""
        if install_grad_hooks:
            for p in module.parameters():
                if p.is_leaf and p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = (
                        p.register_hook(self._grad_to_grad),
                        p.register_post_accumulate_grad_hook(lambda q: self._grad_to_grad(q.grad)),
                    )
        return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    def _grad_to_grad(self, grad: torch.Tensor) -> None:
        self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        try:
            super()._pre_fw_hook(module, inputs)
        except NotImplementedError:
            self._in_ac = True


def mark_modules(tracker: _MomentMixin, modules: dict[str, nn.Module]) -> list:
    """Record the tracker's total after each module's forward and backward; returns the hook handles."""
    handles = []
    for name, module in modules.items():
        handles.append(module.register_forward_hook(lambda m, i, o, n=name: tracker.mark("forward", n)))
        handles.append(
            module.register_full_backward_hook(lambda m, gi, go, n=name: tracker.mark("backward", n))
        )
    return handles
