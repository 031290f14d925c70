"""Reserved memory without a trace: the caching allocator's pools, sized from the estimate's own terms.

Chapter "Where the memory goes" (its verdicts) and the appendix "How the estimates are checked", sections "Held
to published GPU runs" and "The caching allocator, replayed".
The estimator counts tensor bytes (what ``torch.cuda.max_memory_allocated`` reads); a GPU has to hold the
allocator's *reserved* segments (``torch.cuda.max_memory_reserved``) plus memory outside the allocator (CUDA
context, NCCL buffers). The caching allocator keeps one pool per stream (``smolfsdp.audit.allocator_replay``), and
FSDP allocates on three: the default stream (activations, parameters, optimizer state), the all-gather stream
(FSDP1's unshard stream, FSDP2's all-gather copy-in stream: the gathered units) and the reduce-scatter stream
(FSDP1's post-backward stream, FSDP2's reduce-scatter stream: the gradient shards, made there and held until the
optimizer step). Memory cached in one pool cannot serve another, so reserved is the sum of the pools:

    reserved = DEFAULT_POOL_FACTOR x (default-stream tensors at their fullest) + all-gather pool
               + reduce-scatter pool + cuBLAS workspace

each term in :func:`reserved_parts`. The factor is the default pool's fragmentation, fitted to the allocator
replayed on the book's 16 setups (``data/results/dryrun/replay_grid.json``); every published reserved number is
held out of the fit (``data/results/published/check.json``). ``smolfsdp dryrun`` replays the real allocation
order instead (``smolfsdp.audit.allocator_replay.replay``): use it where this estimate is close to a card.

    python -c "from smolfsdp.estimate.reserved import margin_text; print(margin_text())"
"""

from __future__ import annotations

import math

#: The default stream's pool: reserved / its fullest tensor bytes, the geometric mean of the 16 setups of
#: data/results/dryrun/replay_grid.json (scripts/replay_grid.py: the caching allocator replayed on the dry run
#: of each book recipe), fitted by ``fit_default_pool_factor`` and rounded to 3 places; tests/test_published.py
#: holds the constant to the fit. Its residuals against those replays are :data:`REPLAY_ERROR_PCT`.
DEFAULT_POOL_FACTOR = 1.104

#: (lowest, highest) error % of :func:`reserved_parts`'s total against the replay on those 16 setups, rounded
#: out to whole percents; tests/test_published.py holds them. The range ``reserved_range_bytes`` states.
REPLAY_ERROR_PCT = (-15.0, 7.0)

#: cuBLAS workspace, allocated through the caching allocator once per handle/stream: PyTorch "CUDA semantics"
#: notes (cuBLAS workspaces; CUBLAS_WORKSPACE_CONFIG default ":4096:8" on Hopper = 8 x 4 MiB = 32 MiB).
CUBLAS_WORKSPACE_BYTES = 32 * 2**20

#: The replay the factor is fitted to.
REPLAY_GRID = "data/results/dryrun/replay_grid.json"


def _sharded(est) -> bool:
    return est.world_size > 1 and est.strategy != "NO_SHARD" and est.gathered_bytes > 0


def stream_pool_bytes(est, rs_input_on_rs_stream: bool = False) -> dict[str, int]:
    """Bytes the pools outside the default stream's reserve (0 without a sharded strategy: NO_SHARD, DDP, one
    rank).

    ``all-gather stream``: the gathered units the estimate holds at once (root + current + prefetched layer in the
    compute dtype, ``gathered_bytes``): FSDP1 allocates its unsharded ``FlatParameter`` in the unshard stream
    (``_runtime_utils._unshard``), FSDP2 its all-gather output in the copy-in stream (``foreach_all_gather``).
    ``reduce-scatter stream``: the gradient shards (``grads_bytes``; FSDP1 ``_post_backward_hook`` and FSDP2
    ``foreach_reduce`` make them there), plus for FSDP1 one unit's unsharded gradient and reduce-scatter input
    (``grad_buffer_bytes``: the cast to the reduce dtype runs in the post-backward stream), and for FSDP2 the
    same with ``rs_input_on_rs_stream`` (torch before pytorch/pytorch#129721, 2024-06-27, allocated the
    reduce-scatter input in that stream; torch 2.13 on the default stream). Left out: FSDP1's pre-unshard
    stream (its low-precision shards under mixed precision: 0.1-0.3 GiB in the replays of
    data/results/dryrun/replay_grid.json), which the fitted factor absorbs."""
    if not _sharded(est):
        return {"all-gather stream": 0, "reduce-scatter stream": 0}
    buffer = est.grad_buffer_bytes if est.fsdp_version == 1 or rs_input_on_rs_stream else 0
    return {"all-gather stream": est.gathered_bytes, "reduce-scatter stream": est.grads_bytes + buffer}


def default_stream_tensor_bytes(est) -> int:
    """The default stream's tensors at their fullest: each moment of ``est.moments`` less what lives in the other
    pools then (with a sharded strategy: the gradient shards at every moment but the loss moment, the gathered
    units at every moment but the optimizer step), plus FSDP1's ``record_stream`` blocks. With gradient accumulation the loss moment also
    holds the gradient shards: counted here (an over-estimate by that much)."""
    # without sharding there are no other pools: the gradients and replicas stay in the default one
    grads, gathered = (est.grads_bytes, est.gathered_bytes) if _sharded(est) else (0, 0)
    fullest = max(
        v - (0 if k == "loss" else grads) - (0 if k == "optimizer" else gathered)
        for k, v in est.moments.items()
    )
    return fullest + est.record_stream_bytes


def reserved_parts(est, rs_input_on_rs_stream: bool = False) -> dict[str, int]:
    """Peak reserved bytes and its terms: ``default stream tensors`` (:func:`default_stream_tensor_bytes`),
    ``default stream pool`` (that x :data:`DEFAULT_POOL_FACTOR`), the two pools of :func:`stream_pool_bytes`,
    ``cuBLAS workspace`` and ``reserved`` (their sum)."""
    tensors = default_stream_tensor_bytes(est)
    parts = {"default stream tensors": tensors, "default stream pool": int(tensors * DEFAULT_POOL_FACTOR)}
    pools = stream_pool_bytes(est, rs_input_on_rs_stream)
    parts.update({f"{k} pool": v for k, v in pools.items()}, **{"cuBLAS workspace": CUBLAS_WORKSPACE_BYTES})
    parts["reserved"] = parts["default stream pool"] + sum(pools.values()) + CUBLAS_WORKSPACE_BYTES
    return parts


def fit_default_pool_factor(pairs) -> float:
    """The geometric mean of (replayed reserved - the other pools - cuBLAS) / default-stream tensors over
    ``pairs`` of (replayed reserved bytes, ``MemoryEstimate`` of the same setup). ValueError for no pairs or a
    setup whose default-stream share is not positive."""
    ratios = []
    for replayed, est in pairs:
        rest = replayed - sum(stream_pool_bytes(est).values()) - CUBLAS_WORKSPACE_BYTES
        tensors = default_stream_tensor_bytes(est)
        if rest <= 0 or tensors <= 0:
            raise ValueError(f"{est.model}: no default-stream share to fit (replayed {replayed} bytes).")
        ratios.append(rest / tensors)
    if not ratios:
        raise ValueError("give at least one (replayed reserved, estimate) pair.")
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


def reserved_range_bytes(reserved: int) -> tuple[int, int]:
    """(lowest, highest) peak reserved bytes a ``reserved`` estimate stands for: what the replay would read if
    this setup erred as the fit's worst residuals did (:data:`REPLAY_ERROR_PCT`). A stated uncertainty, not a
    bound."""
    lo, hi = REPLAY_ERROR_PCT
    return int(reserved / (1 + hi / 100)), int(reserved / (1 + lo / 100))


def margin_text() -> str:
    """What a reserved estimate is, its sources and its spread."""
    lo, hi = REPLAY_ERROR_PCT
    return (
        f"reserved = {DEFAULT_POOL_FACTOR} x the default stream's tensors + the all-gather stream's pool (gathered "
        "units) + the reduce-scatter stream's pool (gradient shards; FSDP1 also a unit's reduce buffers) + "
        f"{CUBLAS_WORKSPACE_BYTES >> 20} MiB cuBLAS workspace, then + CUDA context + NCCL buffers outside the "
        "allocator. The caching allocator keeps a pool per stream, and cached memory in one cannot serve another "
        f"(smolfsdp.audit.allocator_replay). {DEFAULT_POOL_FACTOR} is fitted to the allocator replayed on the book's 16 "
        f"setups ({REPLAY_GRID}; this estimate {lo:+.0f} % to {hi:+.0f} % of it); the published runs are held out "
        "(data/results/published/check.json). `smolfsdp dryrun --gpu NAME` replays the real allocation order."
    )


def format_reserved(est, width: int = 41) -> str:
    """Lines for ``smolfsdp memory`` (labels padded to ``width``, as ``format_table``'s): the reserved terms, what
    the verdict compares, and the margin's source."""
    parts = reserved_parts(est)
    rows = [
        (f"reserved: {k}", v) for k, v in parts.items() if k not in ("reserved", "default stream tensors")
    ]
    rows += [("reserved (what the allocator holds)", parts["reserved"]),
             ("= GPU need (+ CUDA context, NCCL)", est.device_need_bytes)]  # fmt: skip
    lines = [f"{k:<{width}}  {v / 2**30:10.3f} GiB" for k, v in rows]
    lo, hi = reserved_range_bytes(parts["reserved"])
    label = f"reserved, replay residuals {REPLAY_ERROR_PCT[0]:+.0f}/{REPLAY_ERROR_PCT[1]:+.0f} %"
    lines.append(f"{label:<{width}}  {lo / 2**30:10.3f} to {hi / 2**30:.3f} GiB")
    return "\n".join([*lines, margin_text()])
