"""What the GPU check's profiled window shows: NCCL kernels, compute busy fraction, per-layer FSDP
ranges; the ``analyze-trace`` command run on it; and which trace is kept.

Used by ``scripts/gpu_check.py`` (``smolfsdp.audit.gpu_check.measure_gpu`` runs the shapes); chapters "Where the
memory goes" and "Reading the profiler" show what it wrote.

    python -c "from smolfsdp.audit.gpu_check.profiled_window import check_trace; print(check_trace(PATH, 36))"
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from smolfsdp.traces import analysis as ta

#: The device tool returns files up to 16 MiB; a trace above this is not kept (its summary is).
TRACE_LIMIT_BYTES = 15 * 2**20


def check_trace(path: Path, n_layers: int) -> dict[str, Any]:
    """What the profiled window shows: NCCL kernels, compute-row busy fraction, per-layer FSDP ranges.

    ``nccl_kernels``: GPU kernels whose name holds "nccl" (0 expected at world size 1: FSDP2 skips
    its all-gather and reduce-scatter for a group of one); ``nccl_ops`` the CPU ops that launched
    any. ``compute_busy_fraction``: busy time over step time of the row with the most compute (a
    CUDA stream on GPU, the Python thread on CPU), per profiled step. ``fsdp_layers``: decoder layers
    that have ``FSDP::`` ranges (all ``n_layers`` expected). Raises TraceError for an unreadable trace.
    """
    df = ta.load_trace(path)
    report = ta.analyze(df)
    kernels = df[df["device"].eq("gpu") & df["cat"].eq("kernel")]
    nccl = kernels[kernels["name"].str.contains("nccl", case=False)]
    ops = ta.collective_kernels(df)["op"].value_counts().to_dict() if len(nccl) else {}
    rows = report.rows[report.rows["device"].eq(report.mode) & report.rows["step"].ge(-1)]
    compute_row = rows.groupby("row")["compute_us"].sum().idxmax() if len(rows) else None
    busy = rows[rows["row"].eq(compute_row)]
    fsdp = df[df["category"].eq("fsdp")]
    layers = sorted(int(x) for x in fsdp.loc[fsdp["layer"].ge(0), "layer"].unique())
    ranges = fsdp["name"].str.replace(r" \(.*\)$| for .*$", "", regex=True).value_counts().to_dict()
    cpu_comm = df[df["device"].eq("cpu") & df["category"].eq("communication")]
    return {
        "mode": report.mode,
        "events": len(df),
        "gpu_kernels": len(kernels),
        "nccl_kernels": len(nccl),
        "nccl_ops": ops,
        # ``name`` is categorical: value_counts lists every category of the trace, most at 0
        "cpu_communication_ops": {k: int(v) for k, v in cpu_comm["name"].value_counts().items() if v},
        "compute_row": compute_row,
        "compute_busy_fraction": [float(x) / 100 for x in busy["busy_pct"]],
        "compute_busy_fraction_mean": float(busy["busy_pct"].mean()) / 100 if len(busy) else None,
        "fsdp_layers": layers,
        "fsdp_layers_expected": n_layers,
        "fsdp_ranges": ranges,
        "profiled_steps": [int(s) for s in report.steps["step"]],
        "step_dur_us": [float(x) for x in report.steps["dur_us"]],
        "notes": report.notes,
    }


def run_analyze_trace(path: Path) -> dict[str, Any]:
    """``smolfsdp analyze-trace --json`` on ``path`` in its own process (the command readers run)."""
    cmd = [sys.executable, "-m", "smolfsdp.cli", "analyze-trace", str(path), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out: dict[str, Any] = {
        "command": f"smolfsdp analyze-trace {path.name} --json",
        "returncode": proc.returncode,
    }
    if proc.returncode == 0:
        (summary,) = json.loads(proc.stdout)
        out.update(steps=len(summary["steps"]), overall=summary["overall"], prefetch=summary["prefetch"])
    else:
        out["stderr"] = proc.stderr[-2000:]
    return out


def keep_trace(traces: dict[str, Path], preferred: str, out: Path) -> str | None:
    """Copy one trace into ``out`` (the preferred shape's, else the smallest) if it fits the limit."""
    order = [preferred] + sorted(
        (k for k in traces if k != preferred), key=lambda k: traces[k].stat().st_size
    )
    for name in order:
        if traces[name].stat().st_size <= TRACE_LIMIT_BYTES:
            target = out / f"trace_{name}.json.gz"
            shutil.copyfile(traces[name], target)
            return target.name
    return None
