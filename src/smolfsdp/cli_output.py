"""What the ``smolfsdp`` commands print for people: small tables with units and thousands separators.

``--json`` prints the same data for machines (``smolfsdp.cli``); these functions only format. Times
in profiler traces are microseconds; they are shown in ms (``1,276.3``) except the per-layer all-gathers,
which are short enough to read in µs. Memory in MiB below 1 GiB, else GiB (binary units, as nvidia-smi
and torch report them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, Callable[[Any], str] | None]]
) -> str:
    """Rows as an aligned text table: ``columns`` are (key, header, formatter); text left-aligned,
    formatted numbers right-aligned; a missing or None value prints ``-``."""
    cells = [
        [("-" if r.get(k) is None else (fmt(r[k]) if fmt else str(r[k]))) for k, _, fmt in columns]
        for r in rows
    ]
    heads = [h for _, h, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    right = [fmt is not None for _, _, fmt in columns]

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)
        ).rstrip()

    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(c) for c in cells])


def ms(us: float) -> str:
    """Microseconds as milliseconds, ``1,276.3``."""
    return f"{us / 1000:,.1f}"


def us(v: float) -> str:
    return f"{v:,.0f}"


def pct(v: float) -> str:
    return f"{v:.1f}"


def count(v: float) -> str:
    return f"{int(v):,}"


def size(n: float | None) -> str:
    """Bytes in MiB below 1 GiB, else GiB."""
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def status(stream) -> Callable[[str], None]:
    """A one-argument print of ``[smolfsdp]`` status lines to ``stream``, flushed at once (long commands
    say each stage as it starts)."""

    def say(msg: str) -> None:
        print(f"[smolfsdp] {msg}", file=stream, flush=True)

    return say


# ------------------------------------------------------------------------------ train
def format_data(d: dict) -> str:
    """The preflight's row accounting (``sft.preflight``'s ``data``) in one line, e.g. ``160 of 180 rows
    kept (dropped: 20 too long), 144 train / 16 eval, columns medical_o1``."""
    if not isinstance(d, dict) or "rows_in" not in d:
        return str(d)
    dropped = [
        f"{d[k]:,} {k.removeprefix('dropped_').replace('_', ' ')}"
        for k in d
        if k.startswith("dropped_") and d[k]
    ]
    text = f"{d['kept']:,} of {d['rows_in']:,} rows kept" + (
        f" (dropped: {', '.join(dropped)})" if dropped else ""
    )
    if "train_rows" in d:
        text += f", {d['train_rows']:,} train / {d.get('eval_rows', 0):,} eval"
    if d.get("packing"):  # smolfsdp.data.packing: packed rows, and how full they are
        t = d["packing"]["train"]
        text += f" (train packed into {t['packed_rows']:,} rows, {t['packing_fill']:.1%} full)"
    if d.get("real_token_share") is not None:
        text += f", {d['real_token_share']:.1%} of the tokens computed were real"
    return text + (f", columns {d['mapping']}" if d.get("mapping") else "")


# ------------------------------------------------------------------------------ bench
def format_bench(bench: dict) -> str:
    """bench.json as a small table with units: step time, throughput, TFLOP/s, MFU (or why there is
    none), peak memory per rank, and the strategy that ran (which may differ from the one asked)."""
    s = bench["summary"]
    if not s.get("timed_steps"):
        return "no timed steps: benchmark_steps must exceed benchmark_warmup_steps"
    mfu = s.get("mfu_median")
    rows = [
        (
            "strategy that ran",
            f"{bench['strategy']} ({bench['engine']} engine, {bench['world_size']} ranks, "
            f"{bench['device_name'] or bench['device']})",
        ),
        ("timed steps", f"{s['timed_steps']} (after {bench['warmup_steps']} warm-up)"),
        (
            "step time, median",
            f"{s['step_time_ms_median']:,.1f} ms "
            f"(min {s['step_time_ms_min']:,.1f}, max {s['step_time_ms_max']:,.1f})",
        ),
        (
            "tokens/s, all ranks",
            f"{s['tokens_per_s_median']:,.0f} ({s['tokens_per_step_mean']:,.0f} tokens/step)",
        ),
        ("TFLOP/s per rank", f"{s['tflops_median']:.4g}"),
        ("MFU", f"{100 * mfu:.1f} %" if mfu is not None else f"- ({bench['mfu_reason']})"),
    ]
    for rank, m in enumerate(bench.get("memory_per_rank") or []):
        if "max_memory_allocated_bytes" in m:
            mem = (
                f"{size(m['max_memory_allocated_bytes'])} allocated, "
                f"{size(m['max_memory_reserved_bytes'])} reserved (GPU peak in the step)"
            )
        else:
            mem = (
                f"{size(m['rss_peak_bytes'])} process RSS peak, {size(m['tensor_bytes'])} in parameters, "
                "gradients and optimizer state"
            )
        rows.append((f"memory, rank {rank}", mem))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# ------------------------------------------------------------------------------ analyze-trace
STEP_COLUMNS = [
    ("step", "step", None),
    ("dur_us", "duration ms", ms),
    ("compute_us", "compute ms", ms),
    ("comm_us", "comm ms", ms),
    ("overlap_us", "overlapped ms", ms),
    ("exposed_comm_us", "exposed comm ms", ms),
    ("overlap_pct", "overlap %", pct),
]
EXCLUDED_COLUMN = ("excluded_events", "excluded events", count)  # shown when a step has any
PHASE_COLUMNS = [  # shown when the trace holds the engine's phase ranges
    ("forward_backward_us", "fwd+bwd ms", ms),
    ("clip_us", "clip ms", ms),
    ("optimizer_us", "optimizer ms", ms),
]
BOUNDARY_COLUMNS = [
    ("step", "step", None),
    ("collectives_head", "at start: count", count),
    ("comm_head_us", "ms", ms),
    ("collectives_tail", "at end: count", count),
    ("comm_tail_us", "ms", ms),
]
ROW_COLUMNS = [
    ("step", "step", None),
    ("row", "thread / stream", None),
    ("busy_us", "busy ms", ms),
    ("idle_us", "idle ms", ms),
    ("busy_pct", "busy %", pct),
    ("gaps", "gaps", count),
    ("longest_gap_us", "longest gap ms", ms),
    ("comm_us", "comm ms", ms),
    ("compute_us", "compute ms", ms),
]
GATHER_COLUMNS = [
    ("unit", "FSDP unit", None),
    ("forward", "forward: count", count),
    ("forward_us", "mean µs", us),
    ("backward", "backward: count", count),
    ("backward_us", "mean µs", us),
]


def per_unit_gathers(gathers: list[dict]) -> list[dict]:
    """All-gathers per FSDP unit (root first, then layers in order): count and mean duration in µs,
    forward and backward apart, over all steps of the trace."""
    units: dict[tuple[int, str], dict] = {}
    for g in gathers:
        u = units.setdefault((g["layer"], g["unit"]), {"unit": g["unit"], "forward": 0, "backward": 0})
        u[g["pass"]] += 1
        u[g["pass"] + "_total"] = u.get(g["pass"] + "_total", 0.0) + g["dur_us"]
    for u in units.values():
        for p in ("forward", "backward"):
            u[p + "_us"] = u[p + "_total"] / u[p] if u[p] else None
    return [units[k] for k in sorted(units)]


def format_trace(s: dict) -> str:
    """One ``summarize_trace`` result as text: overall and per-step communication and overlap, the
    collectives bunched at step boundaries, busy/idle per thread and stream, per-layer FSDP all-gathers
    and prefetch, then the analysis notes."""
    o = s["overall"]
    kinds = list((s.get("data_quality") or {}).get("unsupported_device_kinds") or {})
    what = f"{s['mode'].upper()} trace"
    if kinds and s["mode"] == "cpu":  # device events we do not read: not a CPU trace (the notes count them)
        what = f"CPU side of a {'/'.join(kinds)} trace"
    excluded = [EXCLUDED_COLUMN] if any(r.get("excluded_events") for r in s["steps"]) else []
    out = [
        f"== {s['path']} ({what}, {s['events']:,} events)",
        f"all steps: compute {ms(o['compute_us'])} ms, communication {ms(o['comm_us'])} ms, of which "
        f"{ms(o['overlap_us'])} ms overlapped with compute ({pct(o['overlap_pct'] or 0)} %) and "
        f"{ms(o['exposed_comm_us'])} ms exposed",
        "",
        "Per step (ProfilerStep ranges)",
        table(
            s["steps"],
            STEP_COLUMNS + excluded + [c for c in PHASE_COLUMNS if any(r.get(c[0]) for r in s["steps"])],
        ),
        "",
        "Collectives bunched at step boundaries: communication in the first and last 10 % of each step "
        "(analyze's boundary_frac)",
        table(s["steps"], BOUNDARY_COLUMNS),
        "",
        "Busy and idle time per thread (CPU) and stream (GPU), per step",
        table(sorted(s["rows"], key=lambda r: (r["step"], r["device"], r["row"])), ROW_COLUMNS),
        "",
        "Per-layer FSDP all-gathers, all steps",
    ]
    if s["gathers"]:
        sources = sorted({g["source"] for g in s["gathers"]})
        out += [
            table(per_unit_gathers(s["gathers"]), GATHER_COLUMNS),
            f"(attributed by: {', '.join(sources)})",
        ]
    else:
        out.append("none: no all-gather in this trace belongs to an FSDP unit (see the notes)")
    p = s["prefetch"]
    layers = ", ".join(map(str, p["annotated_layers"])) or "none named"
    out += [
        "",
        f"Prefetch: {p['concurrent_gathers']:,} pairs of all-gathers in flight together (at most "
        f"{p['max_in_flight']:,} at once, of {p['transfers']:,} transfers); {p['annotated']:,} prefetch "
        f"ranges that issued an all-gather (of {p.get('hook_ranges', p['annotated']):,}; layers: {layers}){'' if p['fsdp'] else '; no FSDP range in this trace'}",
    ]
    out += [f"note: {n}" for n in s["notes"]]
    return "\n".join(out)


def asked_label(est) -> str:
    """The configuration a ``smolfsdp memory`` call asked for, as the verdict names it: 'FSDP1 FULL_SHARD +
    activation checkpointing + CPU offload, micro-batch 2' (an estimate of ``smolfsdp.estimate.memory``)."""
    parts = [f"FSDP{est.fsdp_version} {est.strategy}"]
    parts += ["activation checkpointing"] * bool(est.activation_checkpointing) + ["CPU offload"] * bool(
        est.offload
    )
    return " + ".join(parts) + (f", micro-batch {est.micro_batch}" if est.micro_batch > 1 else "")


def gpus_words(n: int) -> str:
    """'1 GPU', '2 GPUs', '1,024 GPUs'."""
    return f"{n:,} GPU{'' if n == 1 else 's'}"


def format_fit_verdict(est, fit, rec) -> str:
    """The "Does FSDP fit?" answer: the configuration asked and its verdict (``fit``, a
    ``smolfsdp.estimate.hardware.FitVerdict``, printed as ``format_fit`` does: the word, the need it is decided
    on, the tensor peak beside it, the card), then the recommendation (the cheapest lever that fits,
    ``smolfsdp.estimate.recommend``; a tight setting is not an answer) and why it differs from what was asked."""
    head = f"Does FSDP fit? asked {asked_label(est)} on {est.world_size} x {fit.gpu}: {fit.line}."
    if rec.decision == "does not fit":
        return f"{head} Nothing fits: {rec.reason}"
    same = rec.estimate.strategy == est.strategy and bool(rec.estimate.offload) == bool(est.offload)
    if rec.lever == "none":
        why = (
            "the configuration asked is the cheapest that fits"
            if same
            else f"a full replica already fits, and {est.strategy} would only add communication"
        )
    elif rec.lever == "more GPUs":
        why = f"nothing fits on {gpus_words(est.world_size)}"
    else:
        why = f"{rec.lever} is the cheapest lever that makes it fit (cheaper ones were tried first, below)"
    return f"{head}\nRecommended: {rec.decision} on {gpus_words(rec.gpus)}, because {why}: {rec.reason}"
