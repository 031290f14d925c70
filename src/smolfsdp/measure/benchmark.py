"""Benchmark mode: timed steps, throughput, MFU, peak memory, and torch.profiler traces.

Chapter "Reading the profiler" (``notebooks/05_profiling.ipynb``). The native engine calls the hooks
here when ``benchmark_steps > 0`` (timed steps, ``runs/<name>/bench.json``, no checkpoints, no final
model) and/or ``profile: true`` (one gzip'd Chrome trace per rank in ``runs/<name>/traces/``).

    smolfsdp bench --config configs/runs/smoke.yaml --benchmark_steps 5 --profile true
    smolfsdp train --benchmark-steps 5 --profile true          # the same run through ``train``

What is counted, per optimizer step (all ranks together):

* ``step_time_ms``: wall time of one optimizer step on rank 0 (data, forward, backward, clip,
  optimizer), after ``torch.cuda.synchronize`` on GPU (the CPU has no asynchronous queue to wait on).
* ``tokens``: non-padding input tokens (``attention_mask`` ones; padding-free: all) of the global batch; prompt and
  answer tokens both count, padding does not. ``tokens_per_s = tokens / step_time``.
* model FLOPs per token, PaLM appendix B (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling
  with Pathways", arXiv:2204.02311): ``6 N + 12 L H Q T`` with N the parameters that take part in a
  matmul (SmolLM3 ties ``lm_head`` to ``embed_tokens``: the matrix counts once, as ``lm_head``), L
  layers, H attention heads, Q head dimension, T the (padded) sequence length of the batch (padding-free:
  the token-weighted mean row length, ``smolfsdp.data.packing.attention_seq_len``).
  LoRA: frozen weights get no weight gradient, so N splits into ``4 N_frozen + 6 N_trainable``
  (forward 2N, input gradients 2N for all weights, weight gradients 2N for trainable ones only).
* ``tflops``: model FLOPs per second per rank; ``mfu = tflops / peak`` with the bf16 dense peak of
  the GPU from ``smolfsdp.estimate.hardware``. A CPU or a GPU the table does not know: ``mfu`` is None and
  ``mfu_reason`` says why.
* memory: GPU ``max_memory_allocated`` / ``max_memory_reserved`` in the step; CPU: bytes of the
  tensors this rank holds after the optimizer step (parameter shards, gradients, optimizer state;
  activations are not tracked on CPU) and the process RSS (now and peak).
"""

from __future__ import annotations

import contextlib
import json
import resource
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from smolfsdp.data.packing import attention_seq_len
from smolfsdp.estimate.flops import flops_per_token
from smolfsdp.estimate.hardware import gpu_from_device_name
from smolfsdp.sharding.distributed import all_gather_object
from smolfsdp.sharding.shards import storage_bytes

BENCH_FILE = "bench.json"
TOKENS_COUNTED = (
    "non-padding input tokens (attention_mask == 1; every token of a padding-free batch) of the global batch, "
    "prompt and answer"
)


def model_geometry(model: torch.nn.Module) -> dict[str, int]:
    """L, H, Q of a Hugging Face causal LM (from ``model.config``); works on wrapped models too."""
    inner = getattr(model, "module", model)
    c = inner.config
    q = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads, "head_dim": int(q)}


def matmul_params(model: torch.nn.Module, trainable_only: bool = False) -> int:
    """Parameters that take part in a matmul: all of them, a tied embedding once (as ``lm_head``)."""
    seen, total = set(), 0
    for p in model.parameters():
        if trainable_only and not p.requires_grad:
            continue
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


# ------------------------------------------------------------------------------- hardware
def peak_tflops(device_name: str | None) -> tuple[float | None, str]:
    """bf16 dense peak TFLOP/s of a GPU named as ``torch.cuda.get_device_name`` names it.

    Returns ``(tflops, source)`` or ``(None, reason)`` for a CPU (``None``) or a GPU the table in
    ``smolfsdp.estimate.hardware`` does not know; never raises.
    """
    if not device_name:
        return None, "CPU run: smolfsdp.estimate.hardware has no peak FLOP/s for CPUs, so MFU is not defined"
    g = gpu_from_device_name(device_name)
    if g is not None:
        return float(g.bf16_dense_tflops), f"bf16 dense peak of {g.name} ({g.source})"
    return (
        None,
        f"GPU {device_name!r} is not in smolfsdp.estimate.hardware.GPUS, so its peak FLOP/s is unknown",
    )


def step_metrics(
    step_ms: float,
    tokens: int,
    samples: int,
    flops_token: float,
    world_size: int,
    peak: float | None,
) -> dict[str, float | None]:
    """Throughput of one step: samples/s, tokens/s (global), TFLOP/s per rank and MFU (0..1 or None).

    ``step_ms`` in milliseconds, ``tokens`` and ``samples`` over all ranks. Raises ValueError for a
    non-positive step time or world size.
    """
    if step_ms <= 0 or world_size < 1:
        raise ValueError(f"step_ms={step_ms} and world_size={world_size} must be positive")
    s = step_ms / 1e3
    tflops = flops_token * tokens / s / world_size / 1e12
    return {
        "samples_per_s": samples / s,
        "tokens_per_s": tokens / s,
        "tflops": tflops,
        "mfu": tflops / peak if peak else None,
    }


# ----------------------------------------------------------------------------- the meter
def process_rss() -> dict[str, int]:
    """This process's resident memory now and its peak, in bytes, read together from one source.

    Linux: ``VmRSS`` and ``VmHWM`` of ``/proc/self/status`` in one read (the kernel reports the
    high-water mark as at least the current RSS). Mixing psutil's RSS with ``getrusage``'s
    ``ru_maxrss`` read at another moment (and rounded differently) could report a peak below the
    current value. Elsewhere: psutil's RSS and ``ru_maxrss`` (KiB on Linux, bytes on macOS), the peak
    raised to at least the RSS.
    """
    try:
        fields = dict(
            line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line
        )
        rss = int(fields["VmRSS"].split()[0]) * 1024  # "123456 kB"
        peak = int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        import psutil  # deferred: only off Linux

        rss = psutil.Process().memory_info().rss
        scale = 1 if sys.platform == "darwin" else 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return {"rss_bytes": rss, "rss_peak_bytes": max(peak, rss)}


def peak_memory(device: torch.device) -> dict[str, Any]:
    """This rank's memory high-water marks, in bytes, for ``summary.json`` (``peak_memory_per_rank``).

    On a GPU ``max_memory_allocated_bytes`` (tensor bytes, what the estimator's tensor peak predicts) and
    ``max_memory_reserved_bytes`` (the caching allocator's pools, what must fit the card), since the process
    started or since the last ``torch.cuda.reset_peak_memory_stats`` (benchmark mode resets them every step,
    so there they are the last step's); None on a CPU. ``rss_peak_bytes``: the process's resident peak
    (:func:`process_rss`) on every device.
    """
    on_gpu = device.type == "cuda"
    return {
        "device": device.type,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device) if on_gpu else None,
        "rss_peak_bytes": process_rss()["rss_peak_bytes"],
    }


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class StepMeter:
    """Per-step benchmark metrics inside the native loop (one instance per rank)."""

    def __init__(self, cfg, info, model: torch.nn.Module, n_params: int, trainable: int):
        self.cfg, self.info = cfg, info
        self.geometry = model_geometry(model)
        self.n_params, self.trainable = n_params, trainable
        name = torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else None
        self.device_name = name
        self.peak, self.peak_reason = peak_tflops(name)
        self.rows: list[dict[str, Any]] = []
        self._tensor_bytes = 0

    def begin(self) -> None:
        if self.info.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.info.device)

    def after_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Bytes of parameter shards, gradients and optimizer state held now (before zero_grad)."""
        tensors = [_local(p) for p in model.parameters()]
        tensors += [_local(p.grad) for p in model.parameters() if p.grad is not None]
        tensors += [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        self._tensor_bytes = storage_bytes(tensors)

    def metrics(self, step: int, step_ms: float, tokens: int, samples: int, micro) -> dict[str, Any]:
        seq = statistics.fmean(attention_seq_len(b) for b in micro)  # padding-free: each row's own length
        fpt = flops_per_token(self.n_params, seq_len=seq, trainable_params=self.trainable, **self.geometry)
        row: dict[str, Any] = {
            "warmup": step <= self.cfg.benchmark_warmup_steps,
            "seq_len": seq,
            "flops_per_token": fpt,
            **step_metrics(step_ms, tokens, samples, fpt, self.info.world_size, self.peak),
            **self.memory(),
        }
        self.rows.append({"step": step, "step_time_ms": step_ms, "tokens": tokens, "samples": samples, **row})
        return row

    def memory(self) -> dict[str, int]:
        out = {**process_rss(), "tensor_bytes": self._tensor_bytes}
        if self.info.device.type == "cuda":
            out["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(self.info.device)
            out["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(self.info.device)
        return out

    def write(
        self, run_dir: Path, strategy: str, layout: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Gather every rank's memory (a collective: call on all ranks); rank 0 writes bench.json.

        ``strategy`` is what actually ran (``fsdp1``, ``fsdp2``, ``ddp``, ``none``), never just what
        was asked for: the TRL engine on CPU asks for FSDP and runs DDP. ``layout``: how it sharded
        (``sharding_strategy``, ``mesh_shape``, ``mesh_dim_names`` where known), copied as given.
        """
        per_rank = all_gather_object(self.memory())
        if not self.info.is_main:
            return None
        bench = {
            "name": self.cfg.name,
            "engine": self.cfg.engine,
            "fsdp_version": self.cfg.fsdp_version,
            "strategy": strategy,
            **{
                k: v
                for k, v in (layout or {}).items()
                if k in ("sharding_strategy", "mesh_shape", "mesh_dim_names")
            },
            "lora": self.cfg.lora,
            "world_size": self.info.world_size,
            "device": self.info.device.type,
            "device_name": self.device_name,
            "peak_tflops": self.peak,
            "mfu_reason": self.peak_reason,
            "tokens_counted": TOKENS_COUNTED,
            "flops_formula": "6N + 12*L*H*Q*T per token (PaLM appendix B); LoRA: 4*N_frozen + 6*N_trainable",
            "n_params": self.n_params,
            "trainable_params": self.trainable,
            **self.geometry,
            "per_device_train_batch_size": self.cfg.per_device_train_batch_size,
            "gradient_accumulation_steps": self.cfg.gradient_accumulation_steps,
            "warmup_steps": self.cfg.benchmark_warmup_steps,
            "steps": self.rows,
            "summary": summarise(self.rows),
            "memory_per_rank": per_rank,
            "traces": [str(t) for t in trace_files(run_dir)],
        }
        path = Path(run_dir) / BENCH_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(bench, indent=2, default=str))
        tmp.replace(path)
        return bench


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median step time and the throughput it implies, over the timed (non-warm-up) steps."""
    timed = [r for r in rows if not r["warmup"]]
    if not timed:
        return {"timed_steps": 0}
    ms = statistics.median(r["step_time_ms"] for r in timed)
    tokens = statistics.fmean(r["tokens"] for r in timed)
    mfu = [r["mfu"] for r in timed if r["mfu"] is not None]
    return {
        "timed_steps": len(timed),
        "step_time_ms_median": ms,
        "step_time_ms_min": min(r["step_time_ms"] for r in timed),
        "step_time_ms_max": max(r["step_time_ms"] for r in timed),
        "tokens_per_step_mean": tokens,
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in timed),
        "samples_per_s_median": statistics.median(r["samples_per_s"] for r in timed),
        "tflops_median": statistics.median(r["tflops"] for r in timed),
        "mfu_median": statistics.median(mfu) if mfu else None,
    }


# ------------------------------------------------------------------------------ profiler
# what rank 0 logs when the profiler starts (wait, warm-up, active steps, the run folder)
PROFILING_LINE = "profiling: %d step(s) skipped, %d warm-up, %d recorded into %s/traces"


def start_profiler(cfg, info, run_dir: Path):
    """A started ``torch.profiler.profile`` with the configured schedule, or None if ``profile`` is off.

    Each rank writes ``<run_dir>/traces/rank<R>.json.gz`` when the active window ends. The caller
    calls ``prof.step()`` after each optimizer step and :func:`stop_profiler` after the loop.
    """
    if not cfg.profile:
        return None
    out = Path(run_dir) / "traces"
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if info.device.type == "cuda" else [])

    def ready(prof) -> None:
        prof.export_chrome_trace(str(out / f"rank{info.rank}.json.gz"))

    prof = profile(
        activities=acts,
        schedule=schedule(
            wait=cfg.profile_wait, warmup=cfg.profile_warmup, active=cfg.profile_active, repeat=1
        ),
        on_trace_ready=ready,
        record_shapes=cfg.record_shapes,
    )
    prof.start()
    return prof


def stop_profiler(prof) -> None:
    """Stop ``prof`` if there is one (a trace whose active window finished is already written)."""
    if prof is not None:
        prof.stop()


def trace_files(run_dir: str | Path) -> list[Path]:
    """``runs/<name>/traces/rank*.json.gz``, by rank."""
    return sorted(Path(run_dir, "traces").glob("rank*.json.gz"))


def phase(name: str, enabled: bool):
    """``record_function(name)`` when profiling, else a no-op context (the step phases in a trace)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.profiler.record_function(name)


# ------------------------------------------------------------------------------- results
def load_bench(run_dir: str | Path) -> dict[str, Any]:
    """Read ``runs/<name>/bench.json``. Raises FileNotFoundError saying how to make one."""
    path = Path(run_dir) / BENCH_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: run `smolfsdp bench --name {Path(run_dir).name}` (benchmark_steps > 0)."
        )
    return json.loads(path.read_text())


def steps_frame(bench: dict[str, Any]):
    """The per-step rows of a bench.json as a DataFrame (one row per optimizer step)."""
    import pandas as pd  # deferred: only the tables need pandas

    return pd.DataFrame(bench["steps"])
