"""Step timing that a GPU does not fool: CUDA events (no host sync inside the loop) or the wall clock,
and the measured bf16 matmul ceiling that MFU is set against.

Used by ``smolfsdp.audit.gpu_check.measure_gpu`` (chapters "Where the memory goes" and "Reading the profiler").

    python -c "import torch; from smolfsdp.measure.timing import measure_matmul_tflops as m; print(m(torch.device('cpu'), 256, 3))"
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


class StepTimer:
    """Per-step times in ms: CUDA events on a GPU (no host sync inside the loop), else wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[Any, Any]] = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, begin) -> None:
        self.marks.append((begin, self.start()))

    def elapsed_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in self.marks]
        return [(b - a) * 1e3 for a, b in self.marks]

    @property
    def method(self) -> str:
        return (
            "CUDA events (torch.cuda.Event, one pair per step)" if self.cuda else "wall clock (perf_counter)"
        )


def measure_matmul_tflops(device: torch.device, n: int, iters: int) -> dict[str, Any]:
    """The measured ceiling: ``n x n @ n x n`` bf16 matmuls on random data (2 n^3 FLOPs each).

    Warm-up iterations first (cuBLAS handle, heuristics), then ``iters`` timed with :class:`StepTimer`;
    reports the median and the best. Inputs are random (zeros run faster on some GPUs).
    """
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    for _ in range(max(3, iters // 5)):
        c = a @ b
    timer = StepTimer(device)
    for _ in range(iters):
        t = timer.start()
        c = a @ b
        timer.stop(t)
    ms = timer.elapsed_ms()
    del a, b, c
    flops = 2 * n**3
    return {
        "n": n,
        "dtype": "bfloat16",
        "iters": iters,
        "timing": timer.method,
        "ms_median": statistics.median(ms),
        "tflops_median": flops / (statistics.median(ms) / 1e3) / 1e12,
        "tflops_max": flops / (min(ms) / 1e3) / 1e12,
    }
