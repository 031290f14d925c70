"""What in a trace cannot be trusted as written: impossible times, device kinds we do not read, and
GPU work on one stream that overlaps itself. Each finding is counted, named, and turned into a note.

Used by ``smolfsdp.traces.analysis.analyze`` before any sum (chapter "Reading the profiler";
``smolfsdp analyze-trace`` prints the notes, ``--json`` the counts under ``data_quality``).

    python -c "from smolfsdp.traces import load, sanity; print(sanity.screen(load.load_trace('t.json.gz'))[1])"

Impossible times (the event is left out of every figure; the step it belongs to, when that can be
told from a sound launch or start, is marked with the count):

* ``zero``: ``ts == 0`` while the trace's other events carry real (epoch-based) times, all more than a
  day later, as profilers that lose a buffer write them (a trace whose clock starts at 0 is sound).
* ``negative``: ``ts`` or ``dur`` below zero.
* ``overflowing``: not finite (``1e400``, ``"inf"``, ``"nan"``), or a duration longer than one day, or
  a time past 2**53 µs (float64 stops counting single µs there): no profiled event does either.
* ``before its launch``: a GPU event that starts before the CPU call that launched it ended its
  start (a kernel cannot run before it is launched); 1 µs of clock skew is allowed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MAX_DUR_US = 86_400e6  # one day: longer "durations" are wrapped or uninitialised counters
MAX_TIME_US = float(2**53)  # float64 resolves single µs only below this
LAUNCH_SKEW_US = 1.0  # CPU and GPU clocks are aligned by Kineto to about this
GPU_WORK_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # what a stream runs in order
# Kineto activity categories (libkineto ActivityType.h) of devices this package does not analyse:
# their events are counted and left out, so a trace of them is never reported as a plain CPU trace
UNSUPPORTED_KINDS = {
    "mtia_ccp_events": "MTIA",
    "mtia_insight": "MTIA",
    "mtia_counters": "MTIA",
    "mtia_runtime": "MTIA",
    "cuda_profiler_range": "CUPTI range profiler",
    "xpu_scope_profiler": "XPU scope profiler",
    "hpu_op": "HPU",
    "privateuse1_runtime": "PrivateUse1",
    "privateuse1_driver": "PrivateUse1",
}
NAMES_SHOWN = 3  # most frequent event names quoted per finding


def impossible_reasons(df: pd.DataFrame) -> np.ndarray:
    """Per event, why its time is impossible ("" when sound): see the module docstring for each reason."""
    ts, dur = df["ts"].to_numpy(), df["dur"].to_numpy()
    reason = np.full(len(df), "", dtype=object)
    with np.errstate(invalid="ignore", over="ignore"):
        over = ~np.isfinite(ts) | ~np.isfinite(dur) | (dur > MAX_DUR_US) | (np.abs(ts) > MAX_TIME_US)
        neg = ~over & ((ts < 0) | (dur < 0))
        real = ts[~over & (ts > 0)]
        far = len(real) > 0 and real.min() > MAX_DUR_US  # 0 lies more than a day before every real time
        zero = ~over & ~neg & (ts == 0) & far
    reason[zero], reason[neg], reason[over] = "zero", "negative", "overflowing"
    gpu = df["device"].eq("gpu").to_numpy() & (df["correlation"].to_numpy() >= 0) & (reason == "")
    rt = df[df["category"].eq("runtime") & df["correlation"].ge(0)].drop_duplicates("correlation")
    if gpu.any() and len(rt):
        at = pd.Index(rt["correlation"].to_numpy()).get_indexer(df["correlation"].to_numpy()[gpu])
        launch = np.where(at >= 0, rt["ts"].to_numpy()[np.clip(at, 0, None)], -np.inf)
        early = np.zeros(len(df), dtype=bool)
        early[gpu] = ts[gpu] < launch - LAUNCH_SKEW_US
        reason[early] = "before its launch"
    return reason


def _named(df: pd.DataFrame, sel: np.ndarray) -> dict[str, int]:
    """The most frequent event names among ``sel``, with their counts."""
    counts = df["name"].to_numpy()[sel]
    names, n = np.unique(np.asarray(counts, dtype=str), return_counts=True)
    order = np.argsort(-n, kind="stable")[:NAMES_SHOWN]
    return {str(names[i]): int(n[i]) for i in order}


def _short(name: str, width: int = 48) -> str:
    """A kernel name cut for a note (C++ template names run to hundreds of characters; --json has them whole)."""
    return name if len(name) <= width else name[: width - 1] + "…"


def screen(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(the events fit to analyse, what was found): impossible times and unsupported device events
    are removed; same-stream overlap is only counted (busy time already takes the union).

    The findings dict (JSON-ready): ``impossible_times`` {reason: {"events", "names"}},
    ``impossible_frame`` (the removed events, for step attribution; dropped before JSON),
    ``unsupported_device_kinds`` {kind: {"events", "categories"}}, ``same_stream_overlap``
    {"events", "overlap_us", "streams"}, and ``notes`` (one sentence per finding).
    """
    reason = impossible_reasons(df)
    bad = reason != ""
    cats = df["cat"].astype(str).to_numpy()
    unsupported = np.isin(cats, list(UNSUPPORTED_KINDS)) & ~bad
    found: dict[str, Any] = {"impossible_times": {}, "unsupported_device_kinds": {}, "notes": []}
    for why in ("zero", "negative", "overflowing", "before its launch"):
        sel = reason == why
        if sel.any():
            found["impossible_times"][why] = {"events": int(sel.sum()), "names": _named(df, sel)}
    if bad.any():
        parts = [
            f"{v['events']:,} {why} ({', '.join(f'{_short(k)} x{n:,}' for k, n in v['names'].items())})"
            for why, v in found["impossible_times"].items()
        ]
        found["notes"].append(
            f"{int(bad.sum()):,} events with impossible times are left out of every figure: "
            f"{'; '.join(parts)}; the steps they belong to count them under excluded_events"
        )
    for kind in dict.fromkeys(UNSUPPORTED_KINDS[c] for c in np.unique(cats[unsupported])):
        sel = unsupported & np.isin(cats, [c for c, k in UNSUPPORTED_KINDS.items() if k == kind])
        by_cat = pd.Series(cats[sel]).value_counts().to_dict()
        found["unsupported_device_kinds"][kind] = {"events": int(sel.sum()), "categories": by_cat}
        found["notes"].append(
            f"device events of kind {kind} are not analysed: {int(sel.sum()):,} events "
            f"({', '.join(f'{c} {n:,}' for c, n in by_cat.items())}) left out; the figures are of the rest"
        )
    found["impossible_frame"] = df[bad].assign(reason=reason[bad])
    sound = df[~bad & ~unsupported]
    found["same_stream_overlap"] = same_stream_overlap(sound)
    o = found["same_stream_overlap"]
    if o["events"]:
        found["notes"].append(
            f"{o['events']:,} GPU event{'s' if o['events'] > 1 else ''} started before the previous work "
            "on the same stream ended "
            f"({o['overlap_us']:,.1f} µs in all, streams {', '.join(map(str, o['streams']))}); a stream runs "
            "its work in order, so these times are off: busy time counts each instant once"
        )
    return sound, found


def same_stream_overlap(df: pd.DataFrame) -> dict[str, Any]:
    """GPU work (kernels, copies, sets) that starts before the previous work on its stream ends:
    ``{"events": n, "overlap_us": total µs of those overlaps, "streams": [ids]}``."""
    g = df[df["device"].eq("gpu") & df["cat"].astype(str).isin(GPU_WORK_CATS)]
    if g.empty:
        return {"events": 0, "overlap_us": 0.0, "streams": []}
    g = g.sort_values(["pid", "stream", "ts"], kind="stable")
    key = g["pid"].astype(str).to_numpy() + "/" + g["stream"].astype(str).to_numpy()
    reach = g.groupby(key, sort=False)["end"].cummax().to_numpy()
    prev = np.concatenate([[-np.inf], reach[:-1]])
    same = np.concatenate([[False], key[1:] == key[:-1]])
    ts = g["ts"].to_numpy()
    over = same & (ts < prev)
    lap = np.minimum(prev, g["end"].to_numpy()) - ts
    return {
        "events": int(over.sum()),
        "overlap_us": float(lap[over].sum()),
        "streams": sorted({int(s) for s in g["stream"].to_numpy()[over]}),
    }


def attribute_steps(impossible: pd.DataFrame, events: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """How many removed events belong to each step: a GPU event by its (sound) launch's step, any other
    by its start when that is sound; events that cannot be placed count nowhere (the note has them)."""
    if impossible.empty:
        return pd.Series(dtype=np.int64)
    # a GPU event by its launch's step; a launch (or kernel) whose own time is gone by its sound partner's
    linked = events[events["correlation"].ge(0) & events["step"].ge(-1)]
    linked = linked.sort_values("category", key=lambda c: c.ne("runtime"), kind="stable")
    by_corr = linked.drop_duplicates("correlation").set_index("correlation")["step"]
    corr = impossible["correlation"].to_numpy()
    step = pd.Series(corr).map(by_corr).to_numpy(dtype=float, copy=True)
    ts = impossible["ts"].to_numpy()
    with np.errstate(invalid="ignore"):  # a zero, non-finite or negative start places nothing
        placeable = np.isnan(step) & impossible["reason"].ne("zero").to_numpy() & np.isfinite(ts) & (ts > 0)
    k = np.searchsorted(windows["start_us"].to_numpy(), ts, side="right") - 1
    ok = placeable & (k >= 0) & (ts <= windows["end_us"].to_numpy()[np.clip(k, 0, None)])
    step[ok] = windows["step"].to_numpy()[k[ok]]
    counts = pd.Series(step[~np.isnan(step) & (step >= -1)].astype(np.int64)).value_counts()
    counts.attrs["unplaced"] = int(np.isnan(step).sum())  # removed events no step can claim
    return counts


def step_notes(
    windows: pd.DataFrame, impossible: pd.DataFrame, unplaced: int
) -> tuple[dict[str, Any], list[str]]:
    """What the step windows hide: ``overlapping_steps`` {"pairs", "overlap_us", "steps"} (consecutive
    windows, their GPU work included, that overlap: per-step durations then add up past the span the steps
    cover), ``missing_steps`` (step numbers whose ``ProfilerStep#N`` range was removed for an impossible
    time: the step is not analysed) and ``unplaced_events`` (removed events no step could claim, so no
    step's ``excluded_events`` counts them); one note per finding."""
    found: dict[str, Any] = {"overlapping_steps": {"pairs": 0, "overlap_us": 0.0, "steps": []}}
    notes: list[str] = []
    w = windows.sort_values("start_us")
    if len(w) > 1 and int(w["step"].iloc[0]) != -1:
        lap = np.maximum.accumulate(w["end_us"].to_numpy())[:-1] - w["start_us"].to_numpy()[1:]
        pairs = [
            (int(a), int(b)) for a, b, x in zip(w["step"][:-1], w["step"][1:], lap, strict=True) if x > 0
        ]
        o = found["overlapping_steps"] = {
            "pairs": len(pairs),
            "overlap_us": float(lap[lap > 0].sum()),
            "steps": pairs,
        }
        if pairs:
            span = float(w["end_us"].max() - w["start_us"].min())
            notes.append(
                f"{len(pairs)} pair{'s' if len(pairs) > 1 else ''} of steps overlap "
                f"({', '.join(f'{a}/{b}' for a, b in pairs)}; {o['overlap_us']:,.1f} µs in all, a step's GPU work "
                f"included): the step durations add up to {float(w['dur_us'].sum()):,.1f} µs over a "
                f"{span:,.1f} µs span, the overlap counted in both steps"
            )
    names = impossible["name"].astype(str) if len(impossible) else pd.Series(dtype=str)
    gone = sorted({int(n) for n in names.str.extract(r"^ProfilerStep#(\d+)$")[0].dropna()})
    found["missing_steps"] = gone
    if gone:
        notes.append(
            f"step{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}: the ProfilerStep range has an "
            "impossible time, so the step is not analysed (its events count toward no step)"
        )
    found["unplaced_events"] = unplaced
    if unplaced:
        notes.append(
            f"{unplaced:,} of the events with impossible times could not be placed in any step (their time is "
            "gone and no sound launch names their step): no step's excluded_events counts them"
        )
    return found, notes
