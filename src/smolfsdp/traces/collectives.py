"""Steps and collectives of a loaded trace: which step each event belongs to, which CPU code launched
each NCCL kernel, the all-gather of each FSDP unit, and evidence of prefetching.

Used by ``smolfsdp.traces.analysis`` (which re-exports every public name here). Input: a frame from
``trace_load.load_trace``. Joins are vectorised (correlation ids through ``pandas.Index``) or one
sweep per CPU thread (enclosing ranges), so their cost grows with the number of events, not with
kernels x ranges.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def assign_steps(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Add a ``step`` column (GPU events by their launch time) and return (events, step windows, notes).

    Step windows: ``step, start_us, end_us, dur_us``, one per ``ProfilerStep#N`` CPU range, its end
    stretched to the end of the GPU work launched in it. Events launched outside every step get -2;
    a trace without ``ProfilerStep#N`` is one step numbered -1 (a note says so). ``before_recording``
    marks the GPU events launched before the profiler recorded (step -2 too).
    """
    notes: list[str] = []
    marks = df[df["category"].eq("step") & df["device"].eq("cpu")].sort_values("ts")
    if marks.empty:
        notes.append("no ProfilerStep#N annotation in this trace: the whole span is analysed as one step")
        windows = pd.DataFrame({"step": [-1], "start_us": [df["ts"].min()], "end_us": [df["end"].max()]})
    else:
        num = marks["name"].astype(str).str.extract(r"#(\d+)")[0].astype(int).to_numpy()
        windows = pd.DataFrame(
            {"step": num, "start_us": marks["ts"].to_numpy(), "end_us": marks["end"].to_numpy()}
        )
    launch = df["ts"].to_numpy().copy()
    gpu = df["device"].eq("gpu").to_numpy() & (df["correlation"].to_numpy() >= 0)
    rt, at = None, None
    runtime = df[df["category"].eq("runtime") & df["correlation"].ge(0)]
    if gpu.any() and len(runtime):  # a trace of GPU events without launches keeps their own times
        rt = runtime.drop_duplicates("correlation")
        at = pd.Index(rt["correlation"].to_numpy()).get_indexer(df["correlation"].to_numpy()[gpu])
        launch[gpu] = np.where(at >= 0, rt["ts"].to_numpy()[at], launch[gpu])
    early = _before_recording(df, gpu, rt, at) & (not marks.empty)  # one span: nothing is "before"
    launch[early] = -np.inf  # their step is unknown: not the one their kernel ran in
    k = np.searchsorted(windows["start_us"].to_numpy(), launch, side="right") - 1
    inside = (k >= 0) & (launch <= windows["end_us"].to_numpy()[np.clip(k, 0, None)])
    df = df.assign(
        step=np.where(inside, windows["step"].to_numpy()[np.clip(k, 0, None)], -2), before_recording=early
    )
    if len(windows) == 1 and marks.empty:
        df["step"] = -1
    if early.any():
        notes.append(_before_recording_note(df, early, windows))
    dropped = int((df["step"] == -2).sum()) - int(early.sum())
    if dropped:
        events, verb = ("event", "is") if dropped == 1 else ("events", "are")
        notes.append(
            f"{dropped} {events} launched outside any ProfilerStep range {verb} left out of per-step figures"
        )
    # a step's window covers its GPU work too (kernels finish after the CPU range closes)
    ext = df[df["step"] >= -1].groupby("step")["end"].max()
    windows["end_us"] = np.maximum(windows["end_us"], windows["step"].map(ext).fillna(windows["end_us"]))
    windows["dur_us"] = windows["end_us"] - windows["start_us"]
    return df, windows, notes


def _before_recording(df: pd.DataFrame, gpu: np.ndarray, rt: pd.DataFrame | None, at) -> np.ndarray:
    """GPU events launched before the profiler started recording: their launch is not in the trace and
    their correlation id is below every recorded launch's (CUPTI numbers launches in order)."""
    early = np.zeros(len(df), dtype=bool)
    if rt is not None and len(rt):
        early[gpu] = (at < 0) & (df["correlation"].to_numpy()[gpu] < rt["correlation"].min())
    return early


def _before_recording_note(df: pd.DataFrame, early: np.ndarray, windows: pd.DataFrame) -> str:
    g = df[early]
    comm = g["category"].eq("communication")
    first = int(windows["step"].iloc[0])
    return (
        f"{len(g):,} GPU events ({int(comm.sum()):,} of them communication, {g['dur'].sum() / 1000:,.1f} ms) "
        f"were launched before recording started (no launch in the trace, correlation ids below the first "
        f"recorded one): left out of per-step figures rather than counted into step {first}"
    )


def _innermost(ranges: pd.DataFrame, queries: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For each query interval, the positions in ``ranges`` of the innermost enclosing range of each
    category (``communication``, ``fsdp``) on the same thread (-1: none). One sweep per thread with a
    stack of open ranges; a range encloses a query when ``ts <= q.ts`` and ``end >= q.end``."""
    out = {c: np.full(len(queries), -1, dtype=np.int64) for c in ("communication", "fsdp")}
    r_thread = ranges["pid"].astype(str) + "/" + ranges["tid"].astype(str)
    q_thread = queries["pid"].astype(str) + "/" + queries["tid"].astype(str)
    r_ts, r_end, r_cat = (
        ranges["ts"].to_numpy(),
        ranges["end"].to_numpy(),
        ranges["category"].astype(str).to_numpy(),
    )
    q_ts, q_end = queries["ts"].to_numpy(), queries["end"].to_numpy()
    by_thread = pd.Series(np.arange(len(ranges))).groupby(r_thread.to_numpy()).apply(np.asarray).to_dict()
    for thread, q_idx in pd.Series(np.arange(len(queries))).groupby(q_thread.to_numpy()):
        r_idx = by_thread.get(thread, np.array([], dtype=np.int64))
        # ranges before queries at equal ts (a range opened with the launch encloses it), outer first
        items = [(r_ts[i], 0, -r_end[i], i) for i in r_idx] + [(q_ts[j], 1, 0.0, j) for j in q_idx.to_numpy()]
        stack: list[int] = []
        for ts, is_query, _, i in sorted(items):
            while stack and r_end[stack[-1]] < ts:
                stack.pop()
            if not is_query:
                stack.append(i)
                continue
            for cat in out:
                hit = next((r for r in reversed(stack) if r_cat[r] == cat and r_end[r] >= q_end[i]), -1)
                out[cat][i] = hit
    return out["communication"], out["fsdp"]


def collective_kernels(df: pd.DataFrame) -> pd.DataFrame:
    """Every NCCL kernel of a GPU trace, attributed to the CPU code that launched it.

    A kernel and its launch (``cudaLaunchKernel*``/``hipLaunchKernel`` on a CPU thread) share a
    ``correlation`` id; the CPU ranges around the launch on that thread say what asked for the
    collective. Columns: ``step, kind, name, stream, start_us, dur_us`` (the kernel, GPU time),
    ``launch_us`` (CPU), ``op`` (the innermost communication op around the launch: ``nccl:all_reduce``,
    ``c10d::_allgather_base_``, ...), ``fsdp`` (the innermost ``FSDP::``/``FullyShardedDataParallel.``
    range around it, or ""), ``layer`` (the decoder layer named by that range, ``model.layers.N``; -1
    for none, which is the root group when ``fsdp`` is set), ``unit`` and ``row``. FSDP2 runs each
    all-gather inside ``FSDP::all_gather (<fqn>)`` and each reduce-scatter inside
    ``FSDP::post_backward_reduce (<fqn>)``, so on FSDP2 traces every kernel gets its layer; FSDP1 names
    no layer (use the execution order, as :func:`all_gathers` does). Empty for CPU-only traces.
    """
    cols = "step kind name stream start_us dur_us launch_us op fsdp layer unit row".split()
    df = df if "step" in df else assign_steps(df)[0]
    kern = df[df["device"].eq("gpu") & df["category"].eq("communication") & df["cat"].eq("kernel")]
    if kern.empty:
        return pd.DataFrame(columns=cols)
    launches = df[df["category"].eq("runtime") & df["correlation"].ge(0)].drop_duplicates("correlation")
    at = pd.Index(launches["correlation"].to_numpy()).get_indexer(kern["correlation"].to_numpy())
    found = at >= 0
    la = launches.iloc[at[found]]
    # only the ranges that can explain a launch: communication ops and FSDP ranges on CPU threads
    ranges = df[df["device"].eq("cpu") & df["category"].isin(["communication", "fsdp"])]
    comm_at, fsdp_at = _innermost(ranges, la)
    names = np.append(ranges["name"].astype(str).to_numpy(), "")  # position -1 (no range): ""
    layers = np.append(ranges["layer"].to_numpy(), -1)
    op, fsdp = np.full(len(kern), "", dtype=object), np.full(len(kern), "", dtype=object)
    layer = np.full(len(kern), -1, dtype=np.int64)
    op[found], fsdp[found], layer[found] = names[comm_at], names[fsdp_at], layers[fsdp_at]
    launch = kern["ts"].to_numpy().copy()
    launch[found] = la["ts"].to_numpy()
    unit = np.where(layer >= 0, "model.layers." + layer.astype(str), "")
    unit = np.where((layer < 0) & pd.Series(fsdp).str.startswith("FSDP::").to_numpy(), "root", unit)
    out = pd.DataFrame(
        {
            "step": kern["step"].to_numpy(),
            "kind": kern["kind"].astype(str).to_numpy(),
            "name": kern["name"].astype(str).to_numpy(),
            "stream": kern["stream"].to_numpy(),
            "start_us": kern["ts"].to_numpy(),
            "dur_us": kern["dur"].to_numpy(),
            "launch_us": launch,
            "op": op.astype(str),
            "fsdp": fsdp.astype(str),
            "layer": layer.astype(np.int64),
            "unit": unit,
            "row": kern["row"].astype(str).to_numpy(),
        }
    )
    return out[cols].sort_values("start_us", kind="stable").reset_index(drop=True)


def all_gathers(df: pd.DataFrame) -> pd.DataFrame:
    """One row per all-gather of an FSDP unit: ``step, unit, layer, pass, start_us, dur_us, source``.

    GPU traces: the NCCL all-gather kernels (GPU start and duration), each attributed through its
    launch to the FSDP range around it (:func:`collective_kernels`). CPU traces: FSDP2 annotates each
    all-gather (``FSDP::all_gather (model.layers.N)``; the root's has no name) and the layer is read
    from the name. Where no range names the layer (FSDP1, CPU or GPU), the all-gathers are labelled
    by execution order, per step: forward gathers the root first, then layers 0..L-1; backward
    gathers layers L-1..0 again (the root keeps its parameters). ``source`` says which rule
    applied. ``pass`` is backward from the step's first pre-backward hook on.

    A trace with no FSDP range at all (no ``FSDP::*`` or ``FullyShardedDataParallel.*`` event: DDP,
    the TRL engine on CPU) gives no rows, whatever all-gathers it holds (e.g. the Trainer gathering
    metrics); ``out.attrs["notes"]`` then says how many all-gathers were left out.
    """
    df = df if "step" in df else assign_steps(df)[0]
    kernels = collective_kernels(df)
    kernels = kernels[kernels["kind"].eq("all-gather")]
    fsdp2 = df[df["name"].str.startswith("FSDP::all_gather") & ~df["name"].str.contains("copy_out")]
    back = df[df["name"].str.contains("pre_backward", regex=False)].groupby("step")["ts"].min()
    by_order = False
    if not kernels.empty:
        named = kernels["fsdp"].str.startswith("FSDP::").all()
        g = kernels.rename(columns={"start_us": "ts", "dur_us": "dur"})
        g = g.assign(source="NCCL kernel, FSDP:: annotation" if named else "NCCL kernel, by order")
        by_order = not named
    elif not fsdp2.empty:
        g = fsdp2.assign(source="FSDP:: annotation")
        g["unit"] = np.where(g["layer"] >= 0, "model.layers." + g["layer"].astype(str), "root")
    else:
        c10d = df[df["category"].eq("communication") & df["kind"].eq("all-gather") & df["device"].eq("cpu")]
        g = c10d[c10d["name"].str.startswith(("c10d::", "record_param_comms"))]
        g = g.assign(source="c10d op, by order", unit="", layer=-1)
        by_order = True
    notes = []
    if not df["category"].eq("fsdp").any() and not g.empty:
        # FSDP1 records FullyShardedDataParallel.* ranges and FSDP2 FSDP::* ones, on CPU and GPU; with
        # neither, the all-gathers belong to someone else (DDP, the Trainer gathering metrics)
        n = len(g)
        notes.append(
            f"no FSDP unit in this trace: its {n} all-gather{'s' if n != 1 else ''} {'is' if n == 1 else 'are'} not FSDP's"
        )
        g, by_order = g.iloc[:0], False
    # the pass follows the CPU side (a kernel can run after the CPU has moved on to backward)
    cpu_ts = g["launch_us"] if "launch_us" in g else g["ts"]
    g = g.assign(**{"pass": np.where(cpu_ts >= g["step"].map(back).fillna(np.inf), "backward", "forward")})
    if by_order and not g.empty:
        g = g.sort_values("launch_us" if "launch_us" in g else "ts").copy()
        g["ordinal"] = g.groupby(["step", "pass"]).cumcount()
        n = g.groupby(["step", "pass"]).size().unstack(fill_value=0)
        for step, r in n.iterrows():
            f, b = int(r.get("forward", 0)), int(r.get("backward", 0))
            sel_f = (g["step"] == step) & (g["pass"] == "forward")
            sel_b = (g["step"] == step) & (g["pass"] == "backward")
            if f == b + 1:  # root, then layers 0..L-1; backward L-1..0
                g.loc[sel_f, "layer"] = g.loc[sel_f, "ordinal"] - 1
                g.loc[sel_b, "layer"] = b - 1 - g.loc[sel_b, "ordinal"]
            else:
                notes.append(
                    f"step {step}: {f} forward and {b} backward all-gathers do not fit root + L layers"
                )
        g["unit"] = np.where(g["layer"] >= 0, "model.layers." + g["layer"].astype(int).astype(str), "root")
    out = g.rename(columns={"ts": "start_us", "dur": "dur_us"})[
        ["step", "unit", "layer", "pass", "start_us", "dur_us", "source", "row"]
    ].reset_index(drop=True)
    out["layer"] = out["layer"].astype(int)
    out.attrs["notes"] = notes
    return out


def prefetch(df: pd.DataFrame, gathers: pd.DataFrame) -> dict[str, Any]:
    """Evidence of prefetching.

    ``concurrent_gathers``: pairs of all-gather transfers in flight together (NCCL all-gather kernels
    on GPU; ``gloo:all_gather`` on the gloo threads on CPU); ``max_in_flight``. ``annotated``: FSDP2's
    ``FSDP::backward_prefetch for model.layers.N`` ranges (layers listed) and FSDP1's
    ``_pre_backward_prefetch`` / ``_pre_forward_prefetch`` ranges that issued an all-gather (one starts
    inside the range, on its thread), counted; ``hook_ranges``: every such range, empty or not (FSDP1
    enters its hooks under ``NO_PREFETCH`` too). ``fsdp``: whether the trace
    holds any FSDP range at all; when it does not (a DDP run) the transfers are not FSDP's parameters.
    """
    mode_gpu = (df["device"].eq("gpu") & df["category"].eq("communication")).any()
    xfer = df[df["category"].eq("communication") & df["kind"].eq("all-gather")]
    xfer = xfer[xfer["device"].eq("gpu")] if mode_gpu else xfer[xfer["name"].str.startswith("gloo:")]
    s = np.sort(xfer["ts"].to_numpy())
    e = xfer.sort_values("ts")["end"].to_numpy()
    reach = np.maximum.accumulate(e) if len(e) else e
    concurrent = int((s[1:] < reach[:-1]).sum()) if len(s) > 1 else 0
    ev = np.concatenate([s, e])
    d = np.concatenate([np.ones(len(s)), -np.ones(len(e))])
    order = np.lexsort((d, ev))  # at a tie, an end counts before a start
    in_flight = int(np.cumsum(d[order]).max()) if len(ev) else 0
    ranges = df[df["name"].str.contains("prefetch", regex=False) & df["device"].eq("cpu")]
    issued = ranges[_issues_gather(ranges, df)]
    layers = sorted({int(m) for m in issued["name"].str.extract(r"model\.layers\.(\d+)")[0].dropna()})
    return {
        "fsdp": bool(df["category"].eq("fsdp").any()),
        "transfers": int(len(xfer)),
        "concurrent_gathers": concurrent,
        "max_in_flight": in_flight,
        "annotated": int(len(issued)),
        "hook_ranges": int(len(ranges)),
        "annotated_layers": layers,
    }


def _issues_gather(ranges: pd.DataFrame, df: pd.DataFrame) -> np.ndarray:
    """Which prefetch ranges issued an all-gather: one starts inside the range on its thread. FSDP1 enters
    ``_pre_backward_prefetch`` / ``_pre_forward_prefetch`` at every unit whatever the policy (with
    ``NO_PREFETCH`` the range is empty); only a range that gathered the next unit's parameters prefetched."""
    ops = df[df["category"].eq("communication") & df["kind"].eq("all-gather") & df["device"].eq("cpu")]
    found = np.zeros(len(ranges), dtype=bool)
    by_tid = {tid: np.sort(g["ts"].to_numpy()) for tid, g in ops.groupby("tid")}
    for i, (tid, ts, end) in enumerate(zip(ranges["tid"], ranges["ts"], ranges["end"], strict=True)):
        starts = by_tid.get(tid)
        if starts is not None:
            k = np.searchsorted(starts, ts, side="left")
            found[i] = k < len(starts) and starts[k] <= end
    return found
