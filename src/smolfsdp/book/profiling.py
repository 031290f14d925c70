"""Tables and sentences of the chapter "Reading the profiler", computed from bench.json files and traces.

The chapter calls these and shows what they return; every number in its prose comes from here.
Frames keep unit-suffixed column names (``step_time_ms``, ``dur_us``) for
``smolfsdp.book.tables.reader_frame``; sentences are Markdown strings.

    python -c "from smolfsdp.book import profiling; from smolfsdp.measure.benchmark import load_bench; \\
        print(profiling.bench_table({'FSDP2': load_bench('runs/bench')}))"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from smolfsdp.book.figures import palette
from smolfsdp.book.tables import cell_text, number_text
from smolfsdp.measure.benchmark import steps_frame
from smolfsdp.traces.analysis import TraceReport, comm_by_row
from smolfsdp.traces.seed_reading import exposed_share, seed_checks


def _steps(steps) -> str:
    """``[4]`` -> ``"step 4"``; ``[4, 5]`` -> ``"steps 4, 5"``."""
    steps = [int(s) for s in steps]
    return f"step{'s' if len(steps) != 1 else ''} {cell_text(steps)}"


def _timed(bench: dict[str, Any]) -> pd.Series:
    steps = steps_frame(bench)
    return steps.loc[~steps["warmup"], "step_time_ms"]


def bench_table(benches: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per run (index ``run``): what ran, the timed steps, the spread of its step times and the
    tokens per step; the median step time only for GPU runs.

    ``spread_pct`` = 100 · (slowest / fastest timed step − 1): the noise inside one run, the yardstick
    for any difference between runs. CPU runs get no step-time column: runs made one after another on a
    shared CPU machine are not a comparison of strategies (the book's rule: a CPU timing is shown only
    as a ratio measured inside one run, with its spread).
    """
    rows = []
    for label, b in benches.items():
        t = _timed(b)
        row = {
            "run": label,
            "strategy": b["strategy"].upper(),
            "device": b["device"].upper(),
            "timed_steps": len(t),
        }
        if b["device"] == "cuda":
            row["step_time_median_ms"] = float(t.median())
        row["spread_pct"] = 100 * (float(t.max()) / float(t.min()) - 1)
        row["tokens_per_step"] = b["summary"]["tokens_per_step_mean"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


def timing_sentence(benches: dict[str, dict[str, Any]]) -> str:
    """What the step times of these runs can say: the noise inside one run, and (on CPU) why the runs'
    step times are not set side by side."""
    table = bench_table(benches)
    within = float(table["spread_pct"].max())
    sentence = (
        f"Inside one run the slowest timed step is up to **{within:.0f} %** slower than the fastest: that is "
        "the noise any difference between runs would have to beat."
    )
    if "step_time_median_ms" in table:
        return sentence
    return sentence + (
        " The runs' step times are not set side by side: they ran one after another on a small shared CPU "
        "machine, where the load of the moment moves a run's speed by more than the strategy does. They "
        "show that each engine trains and what the meter records, not which strategy is faster; speed is "
        "measured on a GPU (the last section)."
    )


def run_sentence(bench: dict[str, Any]) -> str:
    """Where one bench.json was measured, its MFU (or why there is none) and what a token is.

    Without an MFU the sentence reads ``MFU: none (<mfu_reason>)``: the reason already says why (on CPU
    "... so MFU is not defined"), so the sentence does not say it a second time."""
    s = bench["summary"]
    mfu = f"{100 * s['mfu_median']:.1f} %" if s.get("mfu_median") is not None else "none"
    return (
        f"Measured on {bench['world_size']} × {bench['device'].upper()} ({bench['device_name'] or 'no GPU'}), "
        f"{s['timed_steps']} timed steps. MFU: {mfu} ({bench['mfu_reason']}). Tokens counted: "
        f"{bench['tokens_counted']}."
    )


STEP_COLUMNS = ["step", "step_time_ms", "tokens", "tokens_per_s", "tflops", "tensor_bytes", "rss_peak_bytes"]


def steps_table(bench: dict[str, Any]) -> pd.DataFrame:
    """The per-step rows of a bench.json that a reader compares (index ``step``; warm-up marked).

    ``tflops`` (model TFLOP/s per rank) only for a GPU run (``bench["device"] == "cuda"``): on a CPU it
    measures nothing a reader can compare (no peak to hold it against, and a shared CPU's speed)."""
    columns = [c for c in STEP_COLUMNS if c != "tflops" or bench["device"] == "cuda"]
    steps = steps_frame(bench)[columns + ["warmup"]]
    steps["step"] = [
        f"{s} (warm-up)" if w else str(s) for s, w in zip(steps["step"], steps["warmup"], strict=True)
    ]
    return steps.drop(columns="warmup").set_index("step")


def trace_step_tables(report: TraceReport) -> dict[str, pd.DataFrame]:
    """The report's per-step figures in two frames of a page's width (index ``step``).

    ``"communication"``: step time, compute, communication, overlapped, exposed, overlap %.
    ``"phases"``: step time and the ``forward_backward`` / ``clip`` / ``optimizer`` ranges.
    The step's wall time (the report's ``dur_us``) is named ``step_time_us`` here, so its header reads
    "step time (ms)" beside the step number, not a bare "dur".
    """
    steps = report.steps.set_index("step").rename(columns={"dur_us": "step_time_us"})
    return {
        "communication": steps[
            ["step_time_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us", "overlap_pct"]
        ],
        "phases": steps[["step_time_us", "forward_backward_us", "clip_us", "optimizer_us"]],
    }


def busy_rows(trace: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``comm_by_row`` of a loaded trace without the rows that did no work, and a sentence naming those.

    Dropped: rows whose communication, compute and CPU-op time are all 0 (``comm_us``, ``compute_us``,
    ``cpu_op_us``), e.g. on the real DDP trace a thread of 42 ``cudaEventQuery`` calls (CUDA runtime calls
    are not CPU ops) and the profiler's own thread (1 event). The sentence names each dropped row with
    its events, so nothing leaves the page unsaid; it is ``""`` when no row is dropped.
    ``ta.comm_by_row`` itself keeps every row (``smolfsdp analyze-trace --json`` lists them all).
    """
    by_row = comm_by_row(trace)
    idle = by_row[["comm_us", "compute_us", "cpu_op_us"]].eq(0).all(axis=1)
    dropped = []
    for row in by_row.loc[idle, "row"]:
        names = trace.loc[trace["row"] == row, "name"].value_counts()
        names = names[names > 0]  # ``name`` is categorical: value_counts lists every category
        dropped.append(f"{row} ({', '.join(f'{n:,} × `{name}`' for name, n in names.items())})")
    note = (
        f"Left out of the table, as rows with no communication, compute or CPU-op time: {'; '.join(dropped)}."
        if dropped
        else ""
    )
    return by_row[~idle].reset_index(drop=True), note


def trace_sentence(trace: pd.DataFrame, report: TraceReport) -> str:
    """How big the trace is, which kind, its steps, and any fallback the analysis took."""
    notes = " ".join(f"Note: {n}." for n in report.notes)
    return (
        f"{len(trace):,} events, a {report.mode.upper()} trace; profiled {_steps(report.steps['step'])}. {notes}"
    ).strip()


def timeline_sentence(report: TraceReport) -> str:
    """What to read in the CPU timeline: how busy the compute row is, and where communication runs."""
    c = seed_checks(report).mean()
    return (
        f"Read the rows against each other: the row that computes is busy {c['compute_row_busy_pct']:.0f} % of a "
        f"step; the communication ({palette.word(palette.TRACE_CATEGORY['communication'])}) runs on gloo's own "
        "threads, and the figure below says how much of it "
        "has compute beside it."
    )


def gathers_sentence(report: TraceReport) -> str:
    """What the per-unit all-gather figure holds: units, passes, gathers per pass over the profiled steps."""
    g = report.gathers
    per_pass = g.groupby("pass").size().reindex(["forward", "backward"]).dropna().astype(int)
    layers = sorted({int(x) for x in g.loc[g["layer"] >= 0, "layer"]})
    counts = ", ".join(f"{n:,} in {p}" for p, n in per_pass.items())
    n_steps = report.steps["step"].nunique()
    return (
        f"{len(g):,} all-gathers over {n_steps} profiled step{'s' if n_steps != 1 else ''} ({counts}), decoder layers "
        f"{cell_text(layers)}. Read each unit's two bars: forward and backward gather the same bytes, so a large "
        "difference between them is waiting (on CPU, gloo's queue), not size."
    )


def overlap_sentence(report: TraceReport, what: str) -> str:
    """How much communication was exposed over the report's complete steps, for the sentence under a figure."""
    share = exposed_share(report)
    if share["exposed_pct"] is None:
        return f"{what}: the profiled steps hold no communication."
    return (
        f"{what}, {_steps(share['steps'])}: {number_text(share['comm_us'] / 1e3, 1)} ms of communication, "
        f"of which **{share['exposed_pct']:.0f} %** ({number_text(share['exposed_comm_us'] / 1e3, 1)} ms) ran "
        f"with no compute beside it and {share['overlap_pct']:.0f} % was hidden behind compute."
    )


def seed_check_sentence(report: TraceReport) -> str:
    """The seed's three visual readings against the measured checks, averaged over the profiled steps."""
    c = seed_checks(report).mean()
    return (
        f"On average over the profiled steps the busiest compute row is busy {c['compute_row_busy_pct']:.0f} % "
        f"of the step (its longest gap {number_text(c['compute_row_longest_gap_us'] / 1e3, 1)} ms); "
        f"{c['exposed_comm_pct_of_step']:.0f} % of the step is communication that nothing overlaps; "
        f"{number_text(c['comm_head_us'] / 1e3, 1)} ms of communication falls in the first tenth of a step and "
        f"{number_text(c['comm_tail_us'] / 1e3, 1)} ms in the last; the optimizer takes "
        f"{c['optimizer_pct']:.0f} % of the step."
    )


def prefetch_sentence(prefetch: dict[str, Any]) -> str:
    """FSDP's prefetch as issued (annotated ranges) and as it ran (transfers in flight together), with why
    the count reads as it does when the trace has no FSDP range (DDP: no parameter all-gathers to prefetch).
    ``prefetch``: ``smolfsdp.traces.analysis``'s ``TraceReport.prefetch``."""
    in_flight = (
        f"of {prefetch['transfers']:,} all-gather transfers, {prefetch['concurrent_gathers']:,} pairs were in "
        f"flight together (at most {prefetch['max_in_flight']} at once)"
    )
    if not prefetch["fsdp"]:
        return (
            f"Prefetch: {in_flight}. The trace holds no FSDP range, so no parameter was all-gathered and "
            "nothing could be prefetched (DDP, like the real GPU trace of this chapter, keeps the whole model on "
            "every GPU and all-reduces gradients); the count speaks only for an FSDP trace."
        )
    layers = prefetch["annotated_layers"]
    issued = f"for layers {cell_text(layers)}" if layers else f"in {prefetch['annotated']} ranges"
    return f"Prefetch: FSDP issued `backward_prefetch` {issued}; {in_flight}."


def gpu_overlap_sentence(report: TraceReport, hta_pct: float | None) -> str:
    """The real GPU trace's exposed communication, checked against HTA, and what it can say about FSDP.

    The trace is DDP (gradient all-reduces), so it says nothing on whether FSDP's prefetch hides its
    all-gathers: the sentence says that this needs an FSDP trace from two or more GPUs."""
    share = exposed_share(report)
    steps = _steps(share["steps"])
    check = (
        f"HTA's `get_comm_comp_overlap` gives {hta_pct:.2f} % overlap for the same steps "
        f"(ours {share['overlap_pct']:.2f} %; the residual comes from HTA flooring nanosecond timestamps to whole "
        "microseconds, which opens sub-µs gaps between back-to-back kernels)."
        if hta_pct is not None
        else "HTA is not installed here, so the cross-check is skipped."
    )
    busy = seed_checks(report).loc[share["steps"], "compute_row_busy_pct"].mean()
    return (
        f"Over the complete {steps}, **{share['exposed_pct']:.0f} % of the NCCL time is exposed**: "
        f"{number_text(share['exposed_comm_us'] / 1e3, 1)} of {number_text(share['comm_us'] / 1e3, 1)} ms ran while "
        "no compute kernel did. This trace is DDP: what it exposes is the gradient all-reduce, and this much "
        f"exposed is what the trace shows. The compute stream itself is busy only {busy:.0f} % of a step (the "
        "GPU mostly waits for the CPU to launch work), so the all-reduces find little compute to hide behind. "
        "Whether FSDP's prefetch hides its all-gathers, the seed's picture, needs an FSDP trace from two or "
        "more GPUs. "
        f"{check} HTA drops the last profiler step (its GPU work may be cut off), so both use the complete steps."
    )


#: the prose of the real-trace section of "Reading the profiler", shown only when the trace is there (so a
#: build without it keeps no sentence about a table or figure it does not have)
GPU_SECTION_PROSE = {
    "rows": (
        "One row per thread and CUDA stream that did some work over the whole trace: the NCCL kernels are all on "
        "one stream, the compute kernels on another, and the CPU threads launch them (on a CPU thread, `comm` is "
        "the time inside the CPU-side collective calls, not the transfers)."
    ),
    "timeline": (
        "Read the NCCL stream's row against the compute stream's row: the all-reduce kernels start in the middle of "
        "each step and mostly run while the compute stream is empty. In every row, the height filled in a time "
        "bin is the share of that bin the row was busy (hover for it), so the compute stream's share of the "
        "picture is the busy share quoted above, not the solid block thousands of µs-long kernels would draw."
    ),
    "overlap": (
        f"Read the {palette.word(palette.OVERLAP['exposed'])} part of each bar: it is the exposed share computed "
        "above, step by step; the last profiled "
        "step is the one HTA leaves out."
    ),
    "kernels": (
        "Each profiled step runs the same collectives: two small broadcasts at its start and the gradient "
        "all-reduces in buckets; the GPU time column is the NCCL kernels' own duration."
    ),
}


def absent_trace_sentence(path) -> str:
    """The one sentence a chapter shows when the real GPU trace is not in this build, naming it as the book
    does (``../shared/traces/<file>``, never this machine's absolute path) and how to get it."""
    return (
        f"*The real GPU trace (`../shared/traces/{Path(path).name}`) is not in this build, so this section draws "
        "nothing: the book's workflow fetches it from HolisticTraceAnalysis's test data (README, \"The book\").*"
    )


def absent_figure_sentence() -> str:
    """What a figure cell shows in place of a figure whose input is absent, so its caption never stands bare."""
    return "*Not drawn in this build: its input, the real GPU trace, is absent (see above).*"
