"""The committed GPU measurement beside the estimates, as the book shows it.

The appendix "How the estimates are checked" (``kind="memory"``) and chapter "Reading the profiler"
(``kind="profiling"``) call :func:`gpu_results_section` in their last cell; with nothing committed under
``data/results/h200/`` it says so plainly and shows no number.

    python -c "from smolfsdp.audit.gpu_check.report import gpu_results_section as s; print(s('memory')[0])"
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from smolfsdp.measure.results import GPU_RESULTS_DIR, GpuResults, load_gpu_results

GIB = 2**30
COMMAND = "OUT=<empty folder> bash scripts/gpu_check.sh"


def _measured(results: GpuResults) -> list[dict]:
    """The shapes that ran (a shape that failed, e.g. out of memory, carries ``error`` instead)."""
    return [c for c in results.bench["configs"] if "error" not in c]


def error_pct(estimated: float, measured: float) -> float:
    """Estimator error in percent of the measurement: ``100 * (estimated - measured) / measured``."""
    return 100 * (estimated - measured) / measured


def memory_table(results: GpuResults) -> pd.DataFrame:
    """One row per (shape, component): estimated and measured GiB and the estimator's error in %.

    Components: parameter shards, gradients, AdamW state (storage bytes), everything allocated after
    ``zero_grad`` (against parameters + optimizer state), and the peak allocated over the timed
    steps (against the estimate's device peak, its fullest moment, minus the CUDA context, which the allocator
    never sees), and the peak of each step phase against the moments the dry run checks in that phase
    (``smolfsdp.audit.gpu_check.measure_gpu.PHASE_MOMENTS``: backward against loss/layer/last layer, the optimizer step).
    """
    rows = []
    for cfg in _measured(results):
        mem, st = cfg["memory"], cfg["memory"]["static"]
        est, got = st["estimated"], st["measured"]
        pairs = [
            ("parameter shards", est["params"], got["params_bytes"]),
            ("gradients", est["grads"], got["grads_bytes"]),
            ("AdamW m + v", est["optimizer"], got["optimizer_bytes"]),
            (
                "allocated after zero_grad",
                est["params"] + est["master"] + est["optimizer"],
                st["allocated_after_zero_grad_bytes"],
            ),
            ("peak allocated (timed steps)", mem["peak_estimate_bytes"], mem["peak_allocated_bytes"]),
        ]
        # the peak of each step phase against the dry run's moments in it (absent before issue 34's check)
        for phase, p in mem.get("phases", {}).items():
            if p["estimated_bytes"] is not None:
                pairs.append(
                    (
                        f"peak in {phase} ({', '.join(p['moments'])})",
                        p["estimated_bytes"],
                        p["measured_bytes"],
                    )
                )
        for what, e, m in pairs:
            rows.append(
                {
                    "shape": cfg["name"],
                    "component": what,
                    "estimated (GiB)": e / GIB,
                    "measured (GiB)": None if m is None else m / GIB,
                    "estimator error (%)": None if not m else error_pct(e, m),
                }
            )
    return pd.DataFrame(rows)


def throughput_table(results: GpuResults) -> pd.DataFrame:
    """One row per shape: median step time, tokens/s, model TFLOP/s, MFU against the datasheet peak
    and against the matmul measured in the same run, compute-stream busy share, NCCL kernels."""
    checks = results.trace_summary.get("checks", {})
    rows = []
    for cfg in _measured(results):
        s, chk = cfg["summary"], checks.get(cfg["name"], {})
        busy = chk.get("compute_busy_fraction_mean")
        rows.append(
            {
                "shape": cfg["name"],
                "step (ms)": s["step_time_ms_median"],
                "tokens/s": s["tokens_per_s_median"],
                "model TFLOP/s": s["tflops_median"],
                "MFU vs datasheet (%)": None if s["mfu_median"] is None else 100 * s["mfu_median"],
                "MFU vs measured matmul (%)": 100 * s["mfu_vs_matmul_median"],
                "compute stream busy (%)": None if busy is None else 100 * busy,
                "NCCL kernels": chk.get("nccl_kernels"),
            }
        )
    return pd.DataFrame(rows)


def provenance_line(results: GpuResults) -> str:
    p, cal = results.provenance, results.bench["calibration"]
    smi = p.get("nvidia_smi") or {}
    sha = (p.get("git_sha") or "unknown")[:10]
    return (
        f"Measured on {p.get('gpu')} (driver {smi.get('driver_version', '?')}, CUDA {p.get('cuda')}, "
        f"torch {p['versions'].get('torch')}, transformers {p['versions'].get('transformers')}) on "
        f"{p.get('date_utc')}, commit {sha}, by `{p.get('command')}`; files in "
        f"`{results.path.name}/`. Its bf16 matmul ({cal['matmul']['n']}³) ran at "
        f"{cal['matmul']['tflops_median']:.0f} TFLOP/s; the datasheet's bf16 dense peak is "
        f"{cal['datasheet_peak_tflops']} TFLOP/s."
    )


def gpu_results_section(kind: str, path: str | Path = GPU_RESULTS_DIR) -> list[str | pd.DataFrame]:
    """What a chapter shows, in order: Markdown strings and a table. ``kind``: "memory" or "profiling".

    With no measurement committed: one sentence saying so, no number. With one: what was measured
    and its provenance, the table, and how to read it. Raises ValueError for another ``kind``.
    """
    if kind not in ("memory", "profiling"):
        raise ValueError(f"kind={kind!r}: use 'memory' or 'profiling'")
    results = load_gpu_results(path)
    if results is None:
        held = {  # the memory check sits in the appendix, after the dry run and the published rows it adds to
            "memory": "the estimator's SmolLM3-3B bytes are held to the dry run and the published runs above, "
            "not yet to a GPU of this project's",
            "profiling": "every SmolLM3-3B number in this chapter is an estimate",
        }[kind]
        return [
            f"**No GPU measurement exists yet.** Nothing is committed under `{GPU_RESULTS_DIR}/`, so "
            f"{held}. The check that will measure them on one GPU is `{COMMAND}` (see "
            f"`{GPU_RESULTS_DIR}/README.md`)."
        ]
    if kind == "memory":
        intro = (
            "Estimated against measured bytes on one GPU (world size 1, FSDP2, bf16 compute, fused "
            "AdamW), SmolLM3-3B geometry with random weights. "
        )
        table = memory_table(results).round(3)
        reading = (
            "The error is in percent of the measurement: negative where the estimate is low. The peak "
            "is compared with the estimate's device peak (the fullest moment of a step) less the CUDA "
            "context, which the allocator never sees."
        )
    else:
        intro = "Throughput on one GPU, SmolLM3-3B geometry, random token ids at full length. "
        table = throughput_table(results).round(1)
        reading = (
            "MFU is shown twice: against the datasheet's bf16 dense peak and against the bf16 matmul "
            "timed in the same run, the ceiling this GPU reached that day; the gap between the two "
            "columns is the card's, the gap below the second one is the training step's."
        )
    failed = [f"{c['name']} ({c['error'][:120]})" for c in results.bench["configs"] if "error" in c]
    if failed:
        reading += " Shapes that did not run: " + "; ".join(failed) + "."
    return [intro + provenance_line(results), table, reading]
