"""The seed's reading of a profiler trace, as numbers: the checks of "Reading the profiler".

The seed read its trace by eye (streams busy end to end, prefetch overlapping compute, collectives
bunched at step boundaries). Each of those readings becomes a column per step here, computed from a
:class:`smolfsdp.traces.analysis.TraceReport`; the chapter only shows the frames. Column names carry
their unit (``_pct``, ``_us``) so ``smolfsdp.book.tables.reader_frame`` can label them.

    python -c "from smolfsdp.traces import analysis as ta, checks; \\
        print(checks.seed_checks(ta.analyze(ta.load_trace('runs/bench/traces/rank0.json.gz'))))"
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from smolfsdp.traces.analysis import TraceReport


def seed_checks(report: TraceReport) -> pd.DataFrame:
    """One row per profiled step (index ``step``), the seed's visual checks as measured values.

    Columns: ``compute_row_busy_pct`` and ``compute_row_longest_gap_us`` (the row doing the most
    compute in that step: the Python thread on CPU, the compute stream on GPU), ``exposed_comm_pct_of_step``
    (communication not hidden by compute, % of the step's wall time; named so because the report's
    ``overlap_pct`` is a share of the communication instead), ``comm_head_us`` and
    ``comm_tail_us`` (communication in the first and last 10 % of the step), ``optimizer_pct``
    (the ``optimizer`` range, % of the step; 0 when the trace has no such range).
    """
    rows = report.rows
    main = rows[rows["compute_us"] == rows.groupby("step")["compute_us"].transform("max")]
    main = main.drop_duplicates("step").set_index("step")
    steps = report.steps.set_index("step")
    return pd.DataFrame(
        {
            "compute_row_busy_pct": main["busy_pct"],
            "compute_row_longest_gap_us": main["longest_gap_us"],
            "exposed_comm_pct_of_step": 100 * steps["exposed_comm_us"] / steps["dur_us"],
            "comm_head_us": steps["comm_head_us"],
            "comm_tail_us": steps["comm_tail_us"],
            "optimizer_pct": 100 * steps["optimizer_us"] / steps["dur_us"],
        }
    )


def exposed_share(report: TraceReport, window: str = "complete_steps") -> dict[str, Any]:
    """How much of the communication compute did NOT hide, over ``window`` of the report.

    ``window``: ``"complete_steps"`` (every step but the last, HTA's window) or ``"overall"``.
    Returns ``{"steps", "comm_us", "overlap_us", "exposed_comm_us", "overlap_pct", "exposed_pct"}``
    with ``exposed_pct = 100 - overlap_pct`` (None when the window has no communication).
    Raises ValueError for another window name.
    """
    if window not in ("complete_steps", "overall"):
        raise ValueError(f"window={window!r}: use 'complete_steps' or 'overall'")
    w = getattr(report, window)
    comm = w["comm_us"]
    return {
        "steps": list(w.get("steps", [])),
        "comm_us": comm,
        "overlap_us": w["overlap_us"],
        "exposed_comm_us": w["exposed_comm_us"],
        "overlap_pct": w["overlap_pct"] if comm else None,
        "exposed_pct": 100 * w["exposed_comm_us"] / comm if comm else None,
    }


def layers_gathered(reports: dict[str, TraceReport]) -> pd.DataFrame:
    """Which decoder layers each trace all-gathered, per pass: one row per (label, pass).

    Columns ``version`` (the key of ``reports``), ``pass``, ``layers`` (sorted list of ints),
    ``gathers`` (how many all-gathers of decoder layers in that pass over the profiled steps).
    """
    out = []
    for label, report in reports.items():
        g = report.gathers[report.gathers["layer"] >= 0]
        for pass_, sel in g.groupby("pass", sort=True):
            out.append(
                {
                    "version": label,
                    "pass": pass_,
                    "layers": sorted({int(x) for x in sel["layer"]}),
                    "gathers": len(sel),
                }
            )
    return pd.DataFrame(out, columns=["version", "pass", "layers", "gathers"])


def kernels_by_op(kernels: pd.DataFrame) -> pd.DataFrame:
    """Collective kernels (``collective_kernels``) per step, kind and launching op: count and GPU time.

    Columns ``step, kind, op, kernels, gpu_us``.
    """
    return (
        kernels.groupby(["step", "kind", "op"])
        .agg(kernels=("name", "size"), gpu_us=("dur_us", "sum"))
        .reset_index()
    )


HTA_LOGGER = "hta"  # hta/configs/config.py: the one logger every HTA module logs through


@contextlib.contextmanager
def hta_logging_silenced() -> Iterator[None]:
    """Silence HTA's logger for the ``with`` body and give it back its previous state after.

    HTA (hta.common.trace_parser) logs its progress at WARNING ("Parsed <file> time = ...", "Rounding
    down ns resolution events ...", "leaving parse_traces ..."); with no handler configured Python's
    last-resort handler prints them to stderr, that is into the book's page under the cell. They say
    nothing about the trace, so they are switched off here, for HTA's logger only and only while HTA runs.
    """
    logger = logging.getLogger(HTA_LOGGER)
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def hta_overlap_pct(path: str | Path) -> float | None:
    """HTA's ``get_comm_comp_overlap`` for rank 0 of ``path`` (%), or None when HTA is not installed.

    HTA reads a folder of traces, so the file is copied into a temporary one. HTA drops the last
    profiler step; compare it with ``exposed_share(report, "complete_steps")``. HTA's progress log is
    silenced for the call (:func:`hta_logging_silenced`).
    """
    try:
        from hta.trace_analysis import TraceAnalysis  # deferred: HTA is an optional, heavy dependency
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(path, d)
        with hta_logging_silenced():
            frame = TraceAnalysis(trace_dir=d).get_comm_comp_overlap(visualize=False)
    return float(frame["comp_comm_overlap_pctg"].iloc[0])
