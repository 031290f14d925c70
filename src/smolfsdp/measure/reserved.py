"""Reserved memory: what the caching allocator holds beyond the live tensors, fitted to published runs.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``, section "Held to published GPU runs"). The
estimator counts tensor bytes (what ``torch.cuda.max_memory_allocated`` reads); a GPU has to hold the
allocator's *reserved* segments (``torch.cuda.max_memory_reserved``: freed blocks it keeps cached, split
blocks, rounding to 512-byte / 2 MiB / 20 MiB segment sizes) plus memory outside the allocator (CUDA context,
NCCL buffers). The fit verdicts (``smolfsdp.measure.hardware.fits``) compare that whole need with the card.

    python -c "from smolfsdp.measure.reserved import margin_text; print(margin_text())"
"""

from __future__ import annotations

import math

#: Published (reserved, allocated) peak pairs in GiB, same run: AnswerDotAI/fsdp_qlora benchmarks_03_2024.md
#: (commit 05ed9f2a), Llama-2 7B LoRA, 2 x RTX 3090, batch 1: "the peak allocated memory is 8.28 GiB vs 9.16
#: GiB" at context 512 / 2048 against 10.24 / 10.22 GiB peak reserved. Rows in data/results/published/rows.json.
PUBLISHED_RESERVED_ALLOCATED_GIB = ((10.24, 8.28), (10.22, 9.16))

#: Reserved / allocated at the peak: the geometric mean of the published pairs above (1.237 and 1.116), fitted
#: by ``fit_reserved_factor`` and rounded to 3 places; tests/test_published.py holds the constant to the fit.
#: The spread of the pairs (+-5 %) is the uncertainty of any reserved figure made from it.
RESERVED_FACTOR = 1.175

#: cuBLAS workspace, allocated through the caching allocator once per handle/stream: PyTorch "CUDA semantics"
#: notes (cuBLAS workspaces; CUBLAS_WORKSPACE_CONFIG default ":4096:8" on Hopper = 8 x 4 MiB = 32 MiB).
CUBLAS_WORKSPACE_BYTES = 32 * 2**20


def fit_reserved_factor(pairs=PUBLISHED_RESERVED_ALLOCATED_GIB) -> float:
    """The geometric mean of published reserved / allocated ratios (``pairs``: (reserved, allocated)).

    Raises ValueError for an empty list or a non-positive number."""
    ratios = [r / a for r, a in pairs]
    if not ratios or min(min(p) for p in pairs) <= 0:
        raise ValueError("give at least one (reserved, allocated) pair of positive sizes.")
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


def reserved_from_allocated(allocated_bytes: int) -> int:
    """Peak reserved bytes for a peak of ``allocated_bytes`` live tensor bytes: x ``RESERVED_FACTOR`` +
    ``CUBLAS_WORKSPACE_BYTES``."""
    return int(allocated_bytes * RESERVED_FACTOR) + CUBLAS_WORKSPACE_BYTES


def margin_text() -> str:
    """One line: the margin a tensor peak (estimated or dry-run) needs on a real GPU, and its sources."""
    ratios = ", ".join(f"{r / a:.3f}" for r, a in PUBLISHED_RESERVED_ALLOCATED_GIB)
    return (
        f"margin on a real GPU: reserved = tensors x {RESERVED_FACTOR} + {CUBLAS_WORKSPACE_BYTES >> 20} MiB "
        f"cuBLAS workspace (factor fitted to published reserved/allocated ratios {ratios}, "
        "AnswerDotAI/fsdp_qlora benchmarks_03_2024.md; spread +-5 %), then + CUDA context + NCCL buffers"
    )


def format_reserved(est, width: int = 41) -> str:
    """Lines for ``smolfsdp memory`` (labels padded to ``width``, as ``format_table``'s): the reserved figure,
    what the verdict compares, and the margin's source."""
    rows = [
        (f"reserved (peak x {RESERVED_FACTOR} + cuBLAS)", est.reserved_bytes),
        ("= GPU need (+ CUDA context, NCCL)", est.device_need_bytes),
    ]
    lines = [f"{k:<{width}}  {v / 2**30:10.3f} GiB" for k, v in rows]
    return "\n".join([*lines, margin_text()])
