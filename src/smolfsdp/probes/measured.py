"""The chapters' measurements that launch runs: the estimator against counted bytes, the communication
model against a profiler trace. Each returns the table its chapter shows and raises when the two sides
disagree, so a chapter never shows a check that failed.

Used by chapter "Where the memory goes" (``measure_tiny_memory``) and the appendix "How the estimates are
checked" (``model_vs_trace``).

    python -c "from smolfsdp.probes.measured import measure_tiny_memory; print(measure_tiny_memory())"
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from smolfsdp.config import load_config
from smolfsdp.estimate import comm
from smolfsdp.launch import runner
from smolfsdp.launch.probe import read_results, run_probe
from smolfsdp.measure.memory_measure import compare_with_estimate
from smolfsdp.paths import recipe, repo_root
from smolfsdp.traces import collective_sizes as comm_trace


def measure_tiny_memory(nproc: int = 2, timeout: float = 600) -> pd.DataFrame:
    """Bytes of parameter shards, gradient shards and AdamW state counted on ``nproc`` gloo ranks after one
    step (``scripts/measure_memory.py``, every case of ``memory_measure.CASES``), beside the estimator's
    bytes (``memory_measure.compare_with_estimate``). Raises RuntimeError with the launcher's output tail
    when the launch fails."""
    script = repo_root() / "scripts" / "measure_memory.py"
    with tempfile.TemporaryDirectory(prefix="smolfsdp-measured-") as tmp:  # removed once read
        run_probe("measure_memory.py", script, ["--out", str(Path(tmp) / "measured.json")], nproc, timeout)
        measured = read_results(tmp, "measured.json")
    return compare_with_estimate(measured)


COMPONENTS = {"params": "parameters", "grads": "gradients", "optimizer": "AdamW m + v"}


def memory_check_view(compared: pd.DataFrame) -> pd.DataFrame:
    """:func:`measure_tiny_memory`'s table for reading: one row per (case, rank), the bytes counted on that
    rank per component and in total (exact integers), and whether the estimator's prediction equals
    each of them (``"exact"``) or by how much it is off (relative error of the static total)."""
    view = compared.set_index(["case", "rank"])
    out = pd.DataFrame(index=view.index)
    for key, label in COMPONENTS.items():
        out[f"{label} (bytes)"] = view[f"measured_{key}"].astype(int)
    out["static total (bytes)"] = view["measured_static"].astype(int)
    exact = pd.concat(
        [view[f"measured_{k}"] == view[f"estimated_{k}"] for k in (*COMPONENTS, "static")], axis=1
    ).all(axis=1)
    out["estimate"] = [
        "exact" if ok else f"{err:+.2e} of the total"
        for ok, err in zip(exact, view["rel_error"], strict=True)
    ]
    order = {case: i for i, case in enumerate(dict.fromkeys(compared["case"]))}  # the measured order
    return out.sort_index(key=lambda idx: idx.map(order) if idx.name == "case" else idx)


def model_vs_trace(runs_dir: str | Path) -> pd.DataFrame:
    """Collectives of one training step: the communication model (``comm.estimate_collectives``) beside a
    profiler trace of the same step (``comm_trace.trace_step_bytes``), for an FSDP1 fp32 and an FSDP2 bf16
    benchmark run of the tiny model on 2 gloo ranks written under ``runs_dir``.

    Returns one row per (run, collective kind): count, elements and bytes, model and trace side by side.
    Trace bytes are NaN where the trace records no dtype (gloo's list-style all-gathers, the loop's
    small all-reduces). Raises AssertionError when a count or an element total differs, or the bytes
    differ where the trace has them (the model is exact for these runs)."""
    checks = {}
    for version, precision in ((1, "no"), (2, "bf16")):
        cfg = load_config(
            recipe("smoke"), name=f"comm_fsdp{version}", output_dir=str(runs_dir), fsdp_version=version,
            mixed_precision=precision, benchmark_steps=2, benchmark_warmup_steps=0, profile=True,
            profile_wait=0, profile_warmup=1, profile_active=1, record_shapes=True, eval_size=0,
        )  # fmt: skip
        runner.run(cfg, capture=True, timeout=900)
        model = comm.step_bytes(comm.estimate_collectives(
            "tiny", n_gpus=2, fsdp_version=version, mixed_precision=precision, include_loop=True))  # fmt: skip
        trace = comm_trace.trace_step_bytes(cfg.run_dir / "traces" / "rank0.json.gz")
        checks[f"FSDP{version} ({'fp32' if precision == 'no' else precision})"] = pd.DataFrame({
            "model: count": model["count"], "trace: count": trace["count"],
            "model: elements": model["numel_total"], "trace: elements": trace["numel_total"],
            "model: bytes": model["logical_bytes"], "trace: bytes": trace["logical_bytes"],
        })  # fmt: skip
    table = pd.concat(checks, names=["run", "collective"])
    assert (table["model: count"] == table["trace: count"]).all(), table
    assert (table["model: elements"] == table["trace: elements"]).all(), table
    typed = table["trace: bytes"].notna()
    assert (table.loc[typed, "model: bytes"] == table.loc[typed, "trace: bytes"]).all(), table
    return table


def model_vs_trace_sentence(table: pd.DataFrame) -> str:
    """What :func:`model_vs_trace`'s table shows, counted from it: rows that agree on counts and elements,
    rows whose bytes could be compared, and the rows where the trace records no dtype (shown as —)."""
    typed = table["trace: bytes"].notna()
    untyped = ", ".join(f"{run} {kind}" for run, kind in table.index[~typed])
    return (
        f"All {len(table)} rows agree exactly on the number of collectives and on the elements they move; "
        f"the bytes agree on the {int(typed.sum())} rows where the trace records the dtype. "
        + (
            f"The trace-bytes cells marked — ({untyped}) are collectives whose profiler record carries no "
            "dtype (gloo's list-style all-gathers and the loop's small all-reduces), so there the check is on "
            "elements."
            if untyped
            else ""
        )
    ).strip()
