"""One trustworthy GPU measurement: the SmolLM3-3B geometry on one GPU, with provenance (issue 13).

The appendix "How the estimates are checked" and chapter "Reading the profiler" show what this writes, beside the
estimates, once a run's files are committed under ``data/results/h200/``. On a lent GPU machine:

    OUT=/some/empty/dir bash scripts/gpu_check.sh                 # the real check (CUDA)
    OUT=/tmp/sim bash scripts/gpu_check.sh --simulate-cpu         # the same code path on CPU (CI)

One process, world size 1 (a gloo process group of one, no torchrun: ``smolfsdp.audit.gpu_check.group``). A SmolLM3-3B-geometry model built
from ``data/models/smollm3_3b/config.json`` with random weights (fp32 parameters, SDPA attention),
FSDP2 ``fully_shard`` per decoder layer then the root with bf16 compute and fp32 reduction
(``default_mp_policy("bf16")``), fused AdamW as the HF Trainer uses (``adamw_torch_fused``), random
token ids at full length. For each shape in :data:`GPU_SHAPES`: warm-up steps, timed steps (CUDA
events, profiler off), then a separate profiled window (``torch.profiler``, benchmark's schedule).
A bf16 matmul timed in the same run gives the measured ceiling for MFU
(``smolfsdp.measure.timing``); ``smolfsdp.audit.gpu_check.profiled_window`` reads the profiled window.

Device budget (one H200, estimated): imports 15 s; calibration 5 s; per shape a build of 3.1 B
fp32 parameters on the GPU (~10 s), 3 + 10 + 4 steps of ~0.15-0.5 s (~10 s), trace export and
analysis (~20 s); 3 shapes and the ``analyze-trace`` subprocess: about 3 minutes, well under 8.

Memory: the estimate models the fused AdamW that runs (``estimate_memory(adamw="fused")``: no v-sized
temporary), and one step after the timed ones records the allocator's peak in each phase (forward,
backward, clip, optimizer: :class:`PhasePeaks`) beside the moments the dry run checks (:func:`phase_check`).
A shape that raises anything is recorded with its error and the check goes on with the next one.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from smolfsdp.estimate.flops import flops_per_token
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.measure import benchmark
from smolfsdp.measure.memory_measure import count_state_bytes
from smolfsdp.measure.timing import StepTimer
from smolfsdp.models.modeling import resolve_wrap_class
from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh, default_mp_policy
from smolfsdp.sharding.shards import (
    apply_activation_checkpointing,  # the engine's own FSDP2 activation checkpointing
)

#: What ``smolfsdp.estimate.memory`` calls this recipe: fp32 sharded parameters, gradients and AdamW m, v;
#: bf16 compute (FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``).
RECIPE = "hf-fsdp-bf16"
#: The AdamW step that runs (``build``) and that the estimate models (``estimate_memory(adamw=...)``).
ADAMW = "fused"
#: Fault injection for the CPU test (tests/test_gpu_first_session.py): the shape of this name raises inside its
#: profiled window, as a kernel or export error would; the check must record it and go on.
FAIL_SHAPE_ENV = "SMOLFSDP_GPU_CHECK_FAIL_SHAPE"
#: The files the check writes into ``--out``; the launcher adds the log and nvidia-smi readings.
BENCH, TRACE_SUMMARY, PROVENANCE = "bench.json", "trace_summary.json", "provenance.json"


@dataclass(frozen=True)
class Shape:
    """One configuration: ``micro_batch`` sequences of ``seq_len`` tokens per optimizer step."""

    micro_batch: int
    seq_len: int
    activation_checkpointing: bool = False
    real_run: bool = (
        False  # the shape of configs/runs/smollm3_3b_medical.yaml (per_device 2, max_length 2048, AC)
    )

    @property
    def name(self) -> str:
        return f"mb{self.micro_batch}_seq{self.seq_len}" + ("_ac" if self.activation_checkpointing else "")


GPU_SHAPES = (Shape(1, 2048), Shape(1, 4096), Shape(2, 2048, True, True))
SIM_SHAPES = (Shape(1, 32), Shape(1, 64), Shape(2, 32, True, True))


@dataclass(frozen=True)
class Plan:
    """How many steps of what; the GPU plan and the CPU simulation differ only in sizes."""

    simulate_cpu: bool
    shapes: tuple[Shape, ...]
    warmup_steps: int
    timed_steps: int
    matmul_n: int
    matmul_iters: int
    profile: SimpleNamespace  # the fields benchmark.start_profiler reads from a TrainConfig


def make_plan(simulate_cpu: bool, warmup_steps: int = 3, timed_steps: int = 10) -> Plan:
    if warmup_steps < 1 or timed_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps}, timed_steps={timed_steps}: both must be >= 1")
    # GPU: wait 1, warmup 1, active 2 (benchmark's schedule with one active step fewer, to keep a 3B
    # trace well under the device tool's 16 MiB per file); CPU simulation: warmup 1, active 1
    wait, active = (0, 1) if simulate_cpu else (1, 2)
    prof = SimpleNamespace(
        profile=True, profile_wait=wait, profile_warmup=1, profile_active=active, record_shapes=False
    )
    if simulate_cpu:
        return Plan(True, SIM_SHAPES, min(warmup_steps, 1), min(timed_steps, 2), 256, 3, prof)
    return Plan(False, GPU_SHAPES, warmup_steps, timed_steps, 8192, 50, prof)


# ------------------------------------------------------------------------------- model
def build(config, shape: Shape, device: torch.device):
    """The model (fp32 parameters, SDPA forced), FSDP2-sharded at world size 1, and its fused AdamW."""
    from transformers import AutoModelForCausalLM  # deferred: transformers is the heavy import of this module

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"asked for SDPA attention, got {model.config._attn_implementation!r}")
    model.config.use_cache = False  # SmolLM3 ships use_cache=True; no KV cache in training
    model.train()
    wrap = resolve_wrap_class(model)
    if shape.activation_checkpointing:
        apply_activation_checkpointing(model, wrap)
    apply_fsdp2(model, build_mesh(device.type, 1), wrap, mp_policy=default_mp_policy("bf16"))
    # the Trainer's default optimizer since transformers 5 with torch >= 2.8 is adamw_torch_fused
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    return model, opt


def train_step(
    model, opt, ids: torch.Tensor, profiling: bool, before_optimizer=None, phases=None
) -> torch.Tensor:
    """Forward + backward on full-length random ids, clip to 1.0 (the Trainer's max_grad_norm), AdamW.

    ``before_optimizer()``, if given, runs between the gradient clip and ``opt.step`` (where the
    gradients exist): the memory check counts their bytes there, outside the timed steps.
    ``phases``, if given (a :class:`PhasePeaks`), records the allocator's peak in each step phase.
    """
    rec = phases if phases is not None else PhasePeaks(None)
    with benchmark.phase("forward_backward", profiling):
        with rec("forward"):
            loss = model(input_ids=ids, labels=ids).loss
        with rec("backward"):
            loss.backward()
    with benchmark.phase("clip", profiling), rec("clip"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if before_optimizer is not None:
        before_optimizer()
    with benchmark.phase("optimizer", profiling), rec("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.detach()


class PhasePeaks:
    """``torch.cuda.max_memory_allocated`` within each step phase (bytes), reset at each phase's start.

    ``device`` None or a CPU device: records nothing (the CPU allocator keeps no peak statistics);
    ``peaks`` then stays empty. Use as ``with rec("forward"): ...``.
    """

    def __init__(self, device: torch.device | None):
        self.cuda = device is not None and device.type == "cuda"
        self.device, self.peaks = device, {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        yield
        if self.cuda:
            self.peaks[name] = torch.cuda.max_memory_allocated(self.device)


#: Which moments of ``smolfsdp.estimate.moments.peak_moments`` (what the dry run checks) happen in which
#: phase: backward starts at the ``loss`` moment and holds ``layer``, ``last layer`` and, when the root trains,
#: ``embedding`` and ``root reduce-scatter``; ``optimizer`` is
#: AdamW's step. Forward and the clip have no moment of their own (None: measured, not estimated).
PHASE_MOMENTS = {
    "forward": None,
    "backward": ("loss", "layer", "last layer", "embedding", "root reduce-scatter"),
    "clip": None,
    "optimizer": ("optimizer",),
}


def phase_check(est, peaks: dict[str, int]) -> dict[str, dict]:
    """Per phase: the measured peak (bytes, None on CPU), the estimate's moments for it (bytes; their
    largest, tensors only, as the dry run counts them) and ``error_pct`` = 100 (estimated - measured) / measured."""
    out = {}
    for phase, names in PHASE_MOMENTS.items():
        # the root-gradient moments exist only when the root trains (smolfsdp.estimate.root_grad)
        estimated = max(est.moments.get(n, 0) for n in names) if names else None
        got = peaks.get(phase)
        err = 100 * (estimated - got) / got if estimated is not None and got else None
        out[phase] = {"moments": [n for n in names or () if n in est.moments], "estimated_bytes": estimated, "measured_bytes": got,
                      "error_pct": err}  # fmt: skip
    return out


def _static_estimate(est) -> dict[str, int]:
    return {k: getattr(est, f"{k}_bytes") for k in ("params", "grads", "master", "optimizer")}


def memory_check(
    est, measured: dict[str, int], peak: dict[str, int | None], allocated: int | None, phases: dict[str, int]
):
    """Measured bytes against ``est`` (a ``MemoryEstimate``), component by component, as ratios.

    ``measured``: ``count_state_bytes`` (parameters and AdamW state after ``zero_grad``; gradients
    before it). ``allocated``: ``torch.cuda.memory_allocated`` after ``zero_grad`` (None on CPU).
    ``peak``: ``max_memory_allocated``/``reserved`` over the timed steps (None on CPU). The peak is
    compared with the estimate's device peak (its fullest moment, ``MemoryEstimate.peak_bytes``, made for the
    fused AdamW step that runs: no v-sized temporary) minus what the allocator never sees (CUDA context,
    communicator buffers). ``phases``: the peak per step phase (:class:`PhasePeaks`), compared with the
    moments of that phase (:func:`phase_check`).
    """
    static_est = _static_estimate(est)
    ratio = {k: measured[f"{k}_bytes"] / v for k, v in static_est.items() if v}
    m_po = measured["params_bytes"] + measured["optimizer_bytes"]
    e_po = static_est["params"] + static_est["master"] + static_est["optimizer"]
    ratio["params+optimizer"] = m_po / e_po
    peak_est = est.peak_bytes - est.cuda_context_bytes - est.comm_buffer_bytes
    cpu_reason = (
        "CPU simulation: the CPU allocator keeps no peak statistics; storage bytes are compared instead"
    )
    return {
        "recipe": est.recipe,
        "estimate": est.to_dict(),
        "static": {
            "measured": measured,
            "estimated": static_est,
            "ratio": ratio,
            "allocated_after_zero_grad_bytes": allocated,
            "allocated_ratio": allocated / e_po if allocated is not None else None,
        },
        "peak_allocated_bytes": peak["allocated"],
        "peak_reserved_bytes": peak["reserved"],
        "peak_estimate_bytes": peak_est,
        "peak_ratio": peak["allocated"] / peak_est if peak["allocated"] is not None else None,
        "peak_reason": None if peak["allocated"] is not None else cpu_reason,
        "not_seen_by_allocator_bytes": est.cuda_context_bytes + est.comm_buffer_bytes,
        "adamw": ADAMW,
        "phases": phase_check(est, phases),
    }


def _state_bytes(model, opt) -> dict[str, int]:
    s = count_state_bytes(model, opt)
    return {
        "params_bytes": s["param_bytes"],
        "optimizer_bytes": s["optimizer_bytes"],
        "optimizer_step_bytes": s["optimizer_step_bytes"],
        "n_step_tensors": s["n_step_tensors"],
    }


def run_shape(config, shape: Shape, plan: Plan, device: torch.device, ceiling: float, work: Path, log):
    """Warm-up, timed steps, memory, then the profiled window; returns the shape's record and trace path.

    ``work``: a working folder (not the output folder) for the profiler's raw trace.
    """
    model, opt = build(config, shape, device)
    n_params = benchmark.matmul_params(model)
    geometry = benchmark.model_geometry(model)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak_tflops, peak_source = benchmark.peak_tflops(name)
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (shape.micro_batch, shape.seq_len), generator=gen).to(device)
    tokens = ids.numel()
    for _ in range(plan.warmup_steps):
        train_step(model, opt, ids, False)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    timer, losses = StepTimer(device), []
    for _ in range(plan.timed_steps):
        t = timer.start()
        losses.append(train_step(model, opt, ids, False))
        timer.stop(t)
    times = timer.elapsed_ms()
    peak = {
        "allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
        "reserved": torch.cuda.max_memory_reserved(device) if cuda else None,
    }
    phases = PhasePeaks(device)  # one more step, after the timed ones: its resets would cut their peak
    train_step(model, opt, ids, False, phases=phases)
    measured = _state_bytes(model, opt)  # after zero_grad: parameters and AdamW state
    allocated = torch.cuda.memory_allocated(device) if cuda else None
    fpt = flops_per_token(n_params, seq_len=shape.seq_len, **geometry)
    rows = []
    for i, (ms, loss) in enumerate(zip(times, losses, strict=True), 1):
        m = benchmark.step_metrics(ms, tokens, shape.micro_batch, fpt, 1, peak_tflops)
        rows.append(
            {"step": i, "warmup": False, "step_time_ms": ms, "tokens": tokens, "samples": shape.micro_batch,
             "seq_len": shape.seq_len, "flops_per_token": fpt, "loss": float(loss), **m,
             "mfu_vs_matmul": m["tflops"] / ceiling}
        )  # fmt: skip
    summary = benchmark.summarise(rows)
    summary["mfu_vs_matmul_median"] = statistics.median(r["mfu_vs_matmul"] for r in rows)
    est = estimate_memory(
        config, world_size=1, strategy="FULL_SHARD", recipe=RECIPE, seq_len=shape.seq_len,
        micro_batch=shape.micro_batch, activation_checkpointing=shape.activation_checkpointing, fsdp_version=2, adamw=ADAMW,
    )  # fmt: skip
    grads: dict[str, int] = {}
    trace = _profiled_window(model, opt, ids, plan, device, work / f"trace_{shape.name}", grads, shape.name)
    measured["grads_bytes"] = grads["bytes"]
    log(
        f"{shape.name}: median step {summary['step_time_ms_median']:.1f} ms, {summary['tflops_median']:.1f} TFLOP/s"
    )
    record = {
        "name": shape.name, "micro_batch": shape.micro_batch, "seq_len": shape.seq_len,
        "activation_checkpointing": shape.activation_checkpointing, "real_run_shape": shape.real_run,
        "warmup_steps": plan.warmup_steps, "timed_steps": plan.timed_steps, "timing": timer.method,
        "n_params": n_params, **geometry, "peak_tflops": peak_tflops, "mfu_reason": peak_source,
        "steps": rows, "summary": summary, "memory": memory_check(est, measured, peak, allocated, phases.peaks),
    }  # fmt: skip
    del model, opt
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return record, trace


def _profiled_window(model, opt, ids, plan: Plan, device, work: Path, grads: dict, name: str = "") -> Path:
    """Steps under ``benchmark.start_profiler`` (wait, warmup, active); returns the written trace.

    The first step (``wait`` or ``warmup``: not in the trace) also counts the gradient bytes into
    ``grads["bytes"]``. The profiler is stopped also when a step raises (the next shape starts its own).
    """

    def count_grads() -> None:
        grads["bytes"] = count_state_bytes(model, opt)["grad_bytes"]

    info = SimpleNamespace(device=device, rank=0)
    prof = benchmark.start_profiler(plan.profile, info, work)
    n = plan.profile.profile_wait + plan.profile.profile_warmup + plan.profile.profile_active
    try:
        for i in range(n):
            train_step(model, opt, ids, True, count_grads if i == 0 else None)
            if i == n - 1 and name and os.environ.get(FAIL_SHAPE_ENV) == name:
                raise RuntimeError(f"injected failure in {name}'s profiled window ({FAIL_SHAPE_ENV})")
            prof.step()
    finally:
        benchmark.stop_profiler(prof)
    (trace,) = benchmark.trace_files(work)
    return trace
