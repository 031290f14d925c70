"""PyTorch's CUDA caching allocator, replayed in Python: reserved memory from a sequence of allocations and frees.

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``), sections "Held to published
GPU runs" and "The caching allocator, replayed". ``torch.cuda.max_memory_reserved`` is not
a constant times the tensor bytes: it is the high-water mark of the segments the caching allocator asked CUDA
for, and which segments it needs depends on the *order* of allocations and frees (a 2 GiB block freed after the
loss and carved into activations during backward is not there for the optimizer's 100 MiB states the next
step). The dry run records that order (``smolfsdp.audit.dryrun.tracker``: every storage it sees allocated, resized and
freed); :func:`replay` runs it through the allocator's own policy. No library does this: torch has the
allocator in C++ only (``c10/cuda/CUDACachingAllocator.cpp``) and a GPU to run it on; ``torch.cuda.memory``'s
snapshot tools read a real run's segments, they do not predict them.

What is modelled, from ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x, the default configuration: no
``max_split_size_mb``, no ``expandable_segments``, no ``roundup_power2_divisions``, no garbage collection):

* sizes round up to 512 bytes (``kMinBlockSize``); a request of at most 1 MiB (``kSmallSize``) is *small*;
* small and large requests have separate pools, and each pool is per stream (a block freed on one stream is
  reused only by that stream);
* a request takes the smallest free block of its pool that fits (ties: lowest address), else a new segment
  (``cudaMalloc``) of 2 MiB for a small request (``kSmallBuffer``), 20 MiB for 1-10 MiB (``kLargeBuffer``),
  the request rounded up to 2 MiB above (``kRoundLarge``);
* the rest of a block is split off when it is at least 512 bytes (small pool) or more than 1 MiB (large pool);
  otherwise the whole block is handed out (``allocated`` counts it);
* a freed block merges with free neighbours of its segment;
* when a new segment would pass ``capacity_bytes``, every free *unsplit* segment is released
  (``release_cached_blocks``) and the request retried; counted in ``retries``, an ``OutOfMemory`` beyond.

``record_stream`` (FSDP1's) is modelled by :func:`replay`, not by the allocator here: a block recorded on another
stream is held until the next such free (the allocator polls the stream's events at each request; the replay
has no clock). Not modelled: ``expandable_segments``, memory outside the allocator (CUDA context, NCCL, cuBLAS
workspaces).

    from smolfsdp.audit.allocator_replay import CachingAllocator
    a = CachingAllocator(); a.malloc("x", 5 << 20); a.free("x"); a.peak_reserved   # 20 MiB
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

#: c10/cuda/CUDACachingAllocator.cpp constants (names as there).
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20


class OutOfMemory(RuntimeError):
    """A request that no free block, new segment or release of the cache can serve within the capacity."""


def round_size(nbytes: int) -> int:
    """``round_size``: at least 512 bytes, a multiple of 512."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc`` gets for a rounded request of ``size`` bytes."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(eq=False)
class Block:
    """A piece of a segment: ``addr`` and ``size`` in bytes, its pool (small, stream), neighbours in the segment."""

    addr: int
    size: int
    small: bool
    stream: int
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None


@dataclass
class CachingAllocator:
    """The allocator's state: segments, free blocks per pool, live blocks by key; peaks in bytes.

    ``allocated`` / ``peak_allocated``: bytes of blocks handed out and not freed by the program
    (``memory_allocated``: the rounded block size, whole unsplit blocks included); ``active`` / ``peak_active``:
    those and the blocks :meth:`hold` keeps for pending stream work (``active_bytes``); ``requested`` /
    ``peak_requested``: the bytes asked for, live or held (the tensor bytes a dry run counts); ``reserved`` /
    ``peak_reserved``: bytes of segments (``memory_reserved``). ``before_release``: called before the cache is
    released at capacity (the replay frees its held blocks then, as ``synchronize_and_free_events`` does)."""

    capacity_bytes: int | None = None
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    requested: int = 0
    peak_requested: int = 0
    active: int = 0
    peak_active: int = 0
    before_release: object = None
    segments: int = 0
    retries: int = 0
    by_stream: dict = field(default_factory=dict)  # stream -> bytes of its segments
    _free: dict = field(default_factory=dict)  # (small, stream) -> sorted [(size, addr)]
    _by_addr: dict = field(default_factory=dict)  # addr -> free Block
    _live: dict = field(default_factory=dict)  # key -> Block
    _requested: dict = field(default_factory=dict)  # key -> bytes asked for
    _held: set = field(default_factory=set)  # keys freed by the program, their blocks waiting on a stream
    _next_addr: int = 0

    def malloc(self, key, nbytes: int, stream: int = 0) -> None:
        """Allocate ``nbytes`` for ``key`` on ``stream``. KeyError if ``key`` is live; OutOfMemory past capacity."""
        if key in self._live:
            raise KeyError(f"{key!r} is already allocated")
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        block = self._take(small, stream, size) or self._new_segment(small, stream, size)
        remaining = block.size - size
        if remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE:
            rest = Block(block.addr + size, remaining, small, stream, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.allocated = True
        self._live[key] = block
        self._requested[key] = nbytes
        self.allocated += block.size
        self.active += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_active = max(self.peak_active, self.active)
        self.peak_requested = max(self.peak_requested, self.requested)

    def hold(self, key) -> None:
        """The program freed ``key`` but its block waits for another stream's work (``record_stream``):
        ``allocated`` drops now, ``active`` and the block stay until :meth:`free`."""
        if key not in self._held:
            self._held.add(key)
            self.allocated -= self._live[key].size

    def free(self, key) -> None:
        """Free ``key``'s block (KeyError if it is not live) and merge it with free neighbours."""
        block = self._live.pop(key)
        self.requested -= self._requested.pop(key)
        block.allocated = False
        if key in self._held:
            self._held.discard(key)
        else:
            self.allocated -= block.size
        self.active -= block.size
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self._remove(prev)
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            self._remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        self._insert(block)

    def is_live(self, key) -> bool:
        return key in self._live

    def _insert(self, block: Block) -> None:
        bisect.insort(self._free.setdefault((block.small, block.stream), []), (block.size, block.addr))
        self._by_addr[block.addr] = block

    def _remove(self, block: Block) -> None:
        pool = self._free[(block.small, block.stream)]
        del pool[bisect.bisect_left(pool, (block.size, block.addr))]
        del self._by_addr[block.addr]

    def _take(self, small: bool, stream: int, size: int) -> Block | None:
        pool = self._free.get((small, stream), [])
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        block = self._by_addr[pool[i][1]]
        self._remove(block)
        return block

    def _new_segment(self, small: bool, stream: int, size: int) -> Block:
        alloc = allocation_size(size)
        if self.capacity_bytes is not None and self.reserved + alloc > self.capacity_bytes:
            self.retries += 1
            if self.before_release is not None:
                self.before_release()
            self._release_cached()
            if self.reserved + alloc > self.capacity_bytes:
                raise OutOfMemory(f"{alloc} bytes more than the {self.capacity_bytes}-byte capacity allows")
        block = Block(self._next_addr, alloc, small, stream)
        self._next_addr += alloc
        self.reserved += alloc
        self.segments += 1
        self.by_stream[stream] = self.by_stream.get(stream, 0) + alloc
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached(self) -> None:
        """``release_cached_blocks``: give every free, unsplit segment back to CUDA."""
        for block in list(self._by_addr.values()):
            if block.prev is None and block.next is None:
                self._remove(block)
                self.reserved -= block.size
                self.segments -= 1
                self.by_stream[block.stream] -= block.size


#: Steps a replay runs by default: the first (AdamW's lazy state) and two steady ones; the peaks settle by the
#: second (2, 3, 5 and 8 steps give the same peaks on the published rows' traces).
REPLAY_STEPS = 3


def _split_events(events: list) -> tuple[list, list]:
    """(setup, step): the events before the dry run's first ``forward`` phase, and from it on."""
    start = next((i for i, e in enumerate(events) if e == ("p", "forward")), len(events))
    return events[:start], events[start:]


@dataclass
class _Replay:
    """One replay's allocator and what is pending: FSDP1's record_stream'ed frees, one per recorded stream."""

    alloc: CachingAllocator
    streams: bool
    record_stream: bool
    recorded: dict = field(default_factory=dict)  # key -> streams it was recorded on
    pending: dict = field(default_factory=dict)  # recorded stream -> key whose free waits for it
    own: dict = field(default_factory=dict)  # key -> the stream it was allocated on (also with streams=False)

    def __post_init__(self) -> None:
        self.alloc.before_release = self.flush  # at capacity the allocator syncs its events first

    def malloc(self, key, event) -> None:
        if key in self.pending.values():  # its storage is being reused: the earlier free has happened
            self._release(next(s for s, k in self.pending.items() if k == key))
        stream = event[4] if len(event) > 4 else 0
        self.own[key] = stream
        self.alloc.malloc(key, event[2], stream if self.streams else 0)

    def free(self, key) -> None:
        own = self.own.pop(key, 0)
        later = sorted(s for s in self.recorded.pop(key, ()) if s != own) if self.record_stream else []
        if not later:
            self.alloc.free(key)
            return
        self.alloc.hold(key)
        for s in later[:1]:  # held until that stream's queued work is done: the next such free
            self._release(s)
            self.pending[s] = key

    def step(self, k: int, events: list, deferred: list) -> None:
        """Step ``k`` of the traced step's ``events``; ``deferred``: optimizer-state allocations to make at its
        ``optimizer`` phase (AdamW's lazy state, step 0 only). FSDP's lazy initialisation runs in step 0 only."""
        lazy = False
        for e in events:
            if e[0] == "lazy":
                lazy = bool(e[1])
            elif lazy and k:
                continue
            elif e[0] == "p" and e[1] == "optimizer":
                self.flush()
                for d in deferred:
                    self.malloc(("setup", d[1]), d)
                deferred = []
            elif e[0] == "a":
                self.malloc((k, e[1]), e)
            elif e[0] in ("f", "r"):
                key = next((key for key in ((k, e[1]), ("setup", e[1])) if self.alloc.is_live(key)), None)
                if key is not None and e[0] == "f":
                    self.free(key)
                elif key is not None:
                    self.recorded.setdefault(key, set()).add(e[2])
        self.flush()
        for d in deferred:  # a trace without an optimizer phase: the state is made at the step's end
            self.malloc(("setup", d[1]), d)

    def _release(self, stream) -> None:
        key = self.pending.pop(stream, None)
        if key is not None and self.alloc.is_live(key):
            self.alloc.free(key)

    def flush(self) -> None:
        for stream in list(self.pending):
            self._release(stream)


def _rs_input_on_rs_stream(events: list) -> list:
    """``events`` with FSDP2's reduce-scatter inputs (storages the tracker turned into ``REDUCE_SCATTER``) allocated
    on the stream its reduce-scatter outputs (turned into ``SHARDED_GRAD``) were allocated on."""
    became = {}  # storage -> the categories the trackers gave it after its allocation
    for e in events:
        if e[0] == "c":
            became.setdefault(e[1], set()).add(e[2])
    rs = next((e[4] for e in events if e[0] == "a" and "SHARDED_GRAD" in became.get(e[1], ()) and e[4]), None)
    if rs is None:
        return events
    return [(*e[:4], rs) if e[0] == "a" and "REDUCE_SCATTER" in became.get(e[1], ()) else e for e in events]


def replay(
    events: list,
    steps: int = REPLAY_STEPS,
    lazy_optimizer_state: bool = True,
    streams: bool = True,
    record_stream: bool = True,
    capacity_bytes: int | None = None,
    rs_input_on_rs_stream: bool = False,
) -> dict:
    """Run a dry run's allocation order (``DryRun.alloc_events``, ``smolfsdp.audit.dryrun.streams.allocator_trace``)
    through :class:`CachingAllocator`.

    The setup's tensors (parameters, optimizer state) are allocated first, then the traced step ``steps``
    times: the state after one step is the next step's start, as on a GPU; FSDP's lazy initialisation (first
    forward) runs in the first step only, and what one step leaves allocated (FSDP1's FlatParameter gradients,
    freed by its next pre-forward) is freed as the next begins. ``lazy_optimizer_state``: AdamW makes its
    state inside the first ``optimizer.step()`` (torch's ``_init_group``), after the first forward and backward
    have filled the cache, so the first step allocates the setup's optimizer-state tensors at its
    ``optimizer`` phase. ``streams``: each block in its stream's pool (False: one pool). ``record_stream``: a
    block FSDP1 recorded on another stream is freed only at the next such free for that stream (one unit
    later) or at the optimizer step.

    ``rs_input_on_rs_stream``: FSDP2 as torch built it until pytorch/pytorch#129721 (2024-06-27; 01d66d21 and 415cc262,
    ``torch/distributed/_composable/fsdp/_fsdp_collectives.py``: ``foreach_reduce`` allocates the reduce-scatter
    input inside ``torch.cuda.stream(reduce_scatter_stream)``; torch 2.13 allocates it on the current stream),
    so the reduce-scatter input's blocks go to the pool of the stream the reduce-scatter output was made on.

    Returns ``peak_reserved``, ``peak_allocated``, ``peak_active`` (allocated + blocks held for record_stream)
    and ``peak_requested`` (bytes, over all steps; requested: the tensor bytes, what the dry run's tracker counts), ``reserved_by_step``, ``allocated_by_step`` and
    ``requested_by_step`` (each step's peaks), ``segments``, ``reserved_by_stream`` (bytes of each stream's
    segments at the end), ``retries`` (releases of the cache at
    ``capacity_bytes``). Raises ``OutOfMemory`` when the replay cannot fit ``capacity_bytes``."""
    if rs_input_on_rs_stream:
        events = _rs_input_on_rs_stream(events)
    setup, step = _split_events(events)
    run = _Replay(CachingAllocator(capacity_bytes=capacity_bytes), streams, record_stream)
    deferred = []
    for e in setup:
        if e[0] == "a" and lazy_optimizer_state and e[3] == "OPT":
            deferred.append(e)
        elif e[0] == "a":
            run.malloc(("setup", e[1]), e)
        elif e[0] == "f" and run.alloc.is_live(("setup", e[1])):
            run.free(("setup", e[1]))
    by_step, active = [], 0
    for k in range(steps):
        for key in [key for key in run.alloc._live if key[0] == k - 1]:
            run.free(key)
        a = run.alloc
        a.peak_reserved, a.peak_allocated, a.peak_requested = a.reserved, a.allocated, a.requested
        a.peak_active = a.active
        run.step(k, step, deferred if k == 0 else [])
        by_step.append((run.alloc.peak_reserved, run.alloc.peak_allocated, run.alloc.peak_requested))
        active = max(active, run.alloc.peak_active)
    return {
        "peak_reserved": max(r for r, _, _ in by_step),
        "peak_allocated": max(a for _, a, _ in by_step),
        "peak_requested": max(q for _, _, q in by_step),
        "peak_active": active,
        "reserved_by_step": [r for r, _, _ in by_step],
        "allocated_by_step": [a for _, a, _ in by_step],
        "requested_by_step": [q for _, _, q in by_step],
        "segments": run.alloc.segments,
        "reserved_by_stream": dict(sorted(run.alloc.by_stream.items())),
        "retries": run.alloc.retries,
    }
