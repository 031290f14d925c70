"""Read PyTorch profiler (Kineto) Chrome traces by program: what ran where, and what overlapped.

Chapter "Reading the profiler" (``notebooks/05_profiling.ipynb``). Works on CPU-only traces (gloo:
collectives run on ``pt_gloo_runloop`` threads, compute on the Python thread) and GPU traces
(NCCL kernels on one CUDA stream, compute kernels on others). Pure pandas/numpy.

    smolfsdp analyze-trace runs/bench/traces/rank0.json.gz [--json]

Definitions (every time in microseconds, the trace's own unit):

* busy time of a row (a thread or a stream): length of the union of its events' intervals;
  idle gaps: the step window minus that union.
* communication: GPU mode (the trace has kernels): NCCL kernels; CPU mode: ``c10d::``/``gloo:``/
  ``nccl:`` ops, ``record_param_comms`` and everything nested in them. Compute: GPU mode, the
  other kernels (memcpy/memset excluded, as HTA does); CPU mode, ``cpu_op`` events outside
  communication. ``overlap`` = |union(comm) ∩ union(compute)|; ``exposed`` = comm − overlap;
  ``overlap_pct`` = 100 · overlap / comm (HTA's ``get_comm_comp_overlap`` definition).
* steps: ``ProfilerStep#N`` ranges; GPU events belong to the step of the CPU call that launched
  them (``correlation``). A trace without them is analysed as one span, and ``notes`` says so.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

CPU_COMM_RE = re.compile(r"^(c10d::|_c10d_functional::|gloo:|nccl:|record_param_comms|ProcessGroup)")
NCCL_RE = re.compile(r"nccl", re.IGNORECASE)
FSDP_RE = re.compile(r"^(FSDP::|FullyShardedDataParallel\.)")
LAYER_RE = re.compile(r"model\.layers\.(\d+)")
KINDS = {
    "all-gather": r"all_?gather",
    "reduce-scatter": r"reduce_?scatter",
    "all-reduce": r"all_?reduce",
    "broadcast": r"broadcast",
}
CATEGORIES = (
    "compute",
    "communication",
    "memory",
    "fsdp",
    "step",
    "annotation",
    "runtime",
    "cpu_op",
    "other",
)


class TraceError(ValueError):
    """A file that is not a readable Chrome trace; the message says where it broke."""


# ------------------------------------------------------------------------------ loading
def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(data)
        except zlib.error as err:
            raise TraceError(
                f"{path}: gzip data is corrupt ({err}) after {len(data)} compressed bytes"
            ) from err
        if not d.eof:
            raise TraceError(
                f"{path}: gzip stream ends after {len(data):,} compressed bytes ({len(out):,} bytes "
                "decompressed) without its end marker: the file is truncated"
            )
        data = out
    return data.decode("utf-8", errors="replace")


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno} (character {err.pos:,} of {len(text):,})"
        hint = "the file is truncated" if err.pos >= len(text.rstrip()) - 1 else "not a JSON trace"
        raise TraceError(f"{path}: invalid JSON at {where}: {err.msg}; {hint}") from err


def load_trace(path: str | Path) -> pd.DataFrame:
    """One row per complete (``ph == "X"``) event of a ``.json`` or ``.json.gz`` Chrome trace.

    Columns: ``name, cat, pid, tid, ts, dur, end`` (µs), ``stream`` (-1 for CPU events),
    ``correlation``, ``device`` ("cpu"/"gpu"), ``row`` (thread or stream label), ``category``
    (one of ``CATEGORIES``), ``kind`` (all-gather/reduce-scatter/all-reduce/other for communication),
    ``layer`` (decoder layer in ``model.layers.N`` names, else -1). ``df.attrs`` holds the path, the
    trace's ``distributedInfo``/``deviceProperties`` and thread names.

    Raises FileNotFoundError, or TraceError for truncated, non-JSON or event-less files.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file")
    raw = _read_json(path)
    events = raw.get("traceEvents") if isinstance(raw, dict) else raw
    if not isinstance(events, list):
        raise TraceError(f"{path}: JSON without a traceEvents list; is it a PyTorch profiler trace?")
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            key, new = (e.get("pid"), e.get("tid")), str(e.get("args", {}).get("name", ""))
            if key not in names or not new.endswith("(python)"):  # "pt_gloo_runloop" beats "python"
                names[key] = new
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    if not xs:
        raise TraceError(f"{path}: no complete ('X') events; nothing was recorded")
    args = [e.get("args") or {} for e in xs]
    df = pd.DataFrame(
        {
            "name": [str(e.get("name", "")) for e in xs],
            "cat": [str(e.get("cat", "")) for e in xs],
            "pid": [str(e.get("pid", "")) for e in xs],
            "tid": [str(e.get("tid", "")) for e in xs],
            "ts": np.array([e["ts"] for e in xs], dtype=float),
            "dur": np.array([e.get("dur", 0) for e in xs], dtype=float),
            "stream": np.array([a.get("stream", -1) for a in args], dtype=np.int64),
            "correlation": np.array([a.get("correlation", -1) for a in args], dtype=np.int64),
        }
    )
    df["end"] = df["ts"] + df["dur"]
    df.attrs.update(
        path=str(path),
        distributed=raw.get("distributedInfo") if isinstance(raw, dict) else None,
        devices=raw.get("deviceProperties") if isinstance(raw, dict) else None,
        thread_names={f"{p}/{t}": n for (p, t), n in names.items()},
    )
    return classify(df, names)


def classify(df: pd.DataFrame, thread_names: dict | None = None) -> pd.DataFrame:
    """Add ``device, row, category, kind, layer`` (see :func:`load_trace`); names are classified once each."""
    thread_names = thread_names or {}
    gpu = df["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"])
    df["device"] = np.where(gpu, "gpu", "cpu")
    df["stream"] = np.where(
        gpu & df["stream"].lt(0), pd.to_numeric(df["tid"], errors="coerce").fillna(-1), df["stream"]
    )
    df["stream"] = df["stream"].astype(np.int64)
    tname = {f"{p}/{t}": n for (p, t), n in thread_names.items()}
    key = df["pid"] + "/" + df["tid"]
    cpu_row = key.map(lambda k: tname.get(k) or f"thread {k.split('/')[-1]}")
    df["row"] = np.where(gpu, "GPU " + df["pid"] + " stream " + df["stream"].astype(str), cpu_row)
    # classify each distinct (name, cat) once: traces repeat a few thousand names many times
    pairs = df[["name", "cat"]].drop_duplicates()
    cls = [_classify_one(n, c) for n, c in zip(pairs["name"], pairs["cat"], strict=True)]
    pairs = pairs.assign(category=[c[0] for c in cls], kind=[c[1] for c in cls], layer=[c[2] for c in cls])
    df = df.merge(pairs, on=["name", "cat"], how="left")
    df["in_comm"] = _nested_in(df, df["category"].eq("communication") & df["device"].eq("cpu"))
    return df


def _classify_one(name: str, cat: str) -> tuple[str, str, int]:
    m = LAYER_RE.search(name)
    layer = int(m.group(1)) if m else -1
    kind = next((k for k, rx in KINDS.items() if re.search(rx, name, re.IGNORECASE)), "other")
    if cat == "kernel":
        if NCCL_RE.search(name):
            return "communication", kind, layer
        if name.startswith(("Memcpy", "Memset")):
            return "memory", "", layer
        return "compute", "", layer
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memory", "", layer
    if cat == "gpu_user_annotation":  # GPU-side copies of CPU ranges: labels, not work
        return ("step" if name.startswith("ProfilerStep#") else "annotation"), "", layer
    if name.startswith("ProfilerStep#"):
        return "step", "", layer
    if FSDP_RE.match(name):
        return "fsdp", kind if kind != "other" else "", layer
    if CPU_COMM_RE.match(name) and not name.startswith("_c10d_functional::_wrap"):
        return "communication", kind, layer
    if cat in ("user_annotation", "gpu_user_annotation"):
        return "annotation", "", layer
    if cat in ("cuda_runtime", "cuda_driver"):
        return "runtime", "", layer
    if cat in ("cpu_op", "python_function"):
        return "cpu_op", "", layer
    return "other", "", layer


def _nested_in(df: pd.DataFrame, outer: pd.Series) -> np.ndarray:
    """True for events lying inside one of the ``outer`` events on the same row (outer ones included)."""
    result = np.zeros(len(df), dtype=bool)
    for row, idx in df[outer].groupby("row").groups.items():
        s, e = merge_intervals(df.loc[idx, "ts"].to_numpy(), df.loc[idx, "end"].to_numpy())
        sel = np.flatnonzero(df["row"].to_numpy() == row)
        ts, end = df["ts"].to_numpy()[sel], df["end"].to_numpy()[sel]
        k = np.searchsorted(s, ts, side="right") - 1
        ok = k >= 0
        result[sel[ok]] = end[ok] <= e[k[ok]]
    return result


# ---------------------------------------------------------------------------- intervals
def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint ``(starts, ends)`` arrays."""
    if len(starts) == 0:
        return np.array([]), np.array([])
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def union_length(starts, ends) -> float:
    s, e = merge_intervals(np.asarray(starts, float), np.asarray(ends, float))
    return float((e - s).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of (∪a) ∩ (∪b) for two interval sets given as ``(starts, ends)``."""
    (a_s, a_e), (b_s, b_e) = merge_intervals(*a), merge_intervals(*b)
    times = np.concatenate([a_s, a_e, b_s, b_e])
    if len(times) == 0:
        return 0.0
    delta = np.concatenate(
        [np.ones(len(a_s)), -np.ones(len(a_e)), 2 * np.ones(len(b_s)), -2 * np.ones(len(b_e))]
    )
    order = np.argsort(times, kind="stable")
    t, state = times[order], np.cumsum(delta[order])
    return float(((state[:-1] == 3) * np.diff(t)).sum())


# ------------------------------------------------------------------------------ analysis
@dataclass
class TraceReport:
    """What :func:`analyze` found. DataFrames in µs; ``notes`` explain any fallback taken."""

    mode: str  # "gpu" or "cpu"
    overall: dict[str, float]  # whole trace: comm/compute/overlap
    complete_steps: dict[str, float]  # every step but the last (HTA's default window), summed
    steps: pd.DataFrame  # one row per step
    rows: pd.DataFrame  # one row per (step, row)
    gathers: pd.DataFrame  # one row per all-gather of an FSDP unit
    prefetch: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        recs = lambda d: json.loads(d.to_json(orient="records"))  # noqa: E731 (NaN -> null)
        return {
            "mode": self.mode,
            "overall": self.overall,
            "complete_steps": self.complete_steps,
            "steps": recs(self.steps),
            "rows": recs(self.rows),
            "gathers": recs(self.gathers),
            "prefetch": self.prefetch,
            "notes": self.notes,
        }


def _comm_compute(ev: pd.DataFrame, mode: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    if mode == "gpu":
        g = ev[ev["device"].eq("gpu")]
        return g[g["category"].eq("communication")], g[g["category"].eq("compute")]
    c = ev[ev["device"].eq("cpu")]
    comm = c[c["category"].eq("communication")]
    return comm, c[c["category"].eq("cpu_op") & ~c["in_comm"]]


def _overlap(comm: pd.DataFrame, comp: pd.DataFrame) -> dict[str, float]:
    comm_us = union_length(comm["ts"], comm["end"])
    over = intersection_length(
        (comm["ts"].to_numpy(), comm["end"].to_numpy()), (comp["ts"].to_numpy(), comp["end"].to_numpy())
    )
    return {
        "compute_us": union_length(comp["ts"], comp["end"]),
        "comm_us": comm_us,
        "overlap_us": over,
        "exposed_comm_us": comm_us - over,
        "overlap_pct": 100 * over / comm_us if comm_us else float("nan"),
    }


def assign_steps(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Add a ``step`` column (GPU events by their launch time) and return (events, step windows, notes)."""
    notes: list[str] = []
    marks = df[df["category"].eq("step") & df["device"].eq("cpu")].sort_values("ts")
    if marks.empty:
        notes.append("no ProfilerStep#N annotation in this trace: the whole span is analysed as one step")
        windows = pd.DataFrame({"step": [-1], "start_us": [df["ts"].min()], "end_us": [df["end"].max()]})
    else:
        num = marks["name"].str.extract(r"#(\d+)")[0].astype(int).to_numpy()
        windows = pd.DataFrame(
            {"step": num, "start_us": marks["ts"].to_numpy(), "end_us": marks["end"].to_numpy()}
        )
    launch = df["ts"].to_numpy().copy()
    gpu = df["device"].eq("gpu").to_numpy() & (df["correlation"].to_numpy() >= 0)
    if gpu.any():
        rt = df[df["category"].eq("runtime") & df["correlation"].ge(0)].drop_duplicates("correlation")
        t = pd.Series(rt["ts"].to_numpy(), index=rt["correlation"].to_numpy())
        found = df.loc[gpu, "correlation"].map(t).to_numpy()
        launch[gpu] = np.where(np.isnan(found), launch[gpu], found)
    k = np.searchsorted(windows["start_us"].to_numpy(), launch, side="right") - 1
    inside = (k >= 0) & (launch <= windows["end_us"].to_numpy()[np.clip(k, 0, None)])
    df = df.assign(step=np.where(inside, windows["step"].to_numpy()[np.clip(k, 0, None)], -2))
    if len(windows) == 1 and marks.empty:
        df["step"] = -1
    dropped = int((df["step"] == -2).sum())
    if dropped:
        notes.append(
            f"{dropped} events launched outside any ProfilerStep range are left out of per-step figures"
        )
    # a step's window covers its GPU work too (kernels finish after the CPU range closes)
    ext = df[df["step"] >= -1].groupby("step")["end"].max()
    windows["end_us"] = np.maximum(windows["end_us"], windows["step"].map(ext).fillna(windows["end_us"]))
    windows["dur_us"] = windows["end_us"] - windows["start_us"]
    return df, windows, notes


def analyze(df: pd.DataFrame, *, boundary_frac: float = 0.1) -> TraceReport:
    """Per-step and per-row busy/idle/communication/overlap figures, per-layer all-gathers, prefetch.

    ``boundary_frac``: the first and last fraction of each step window whose communication is
    reported as the step-boundary bursts. Raises ValueError for an empty frame.
    """
    if df.empty:
        raise ValueError("analyze: the trace has no events")
    mode = "gpu" if (df["device"].eq("gpu") & df["category"].eq("compute")).any() else "cpu"
    comm, comp = _comm_compute(df, mode)
    overall = _overlap(comm, comp)
    df, windows, notes = assign_steps(df)
    step_rows, row_rows = [], []
    for w in windows.itertuples(index=False):
        ev = df[df["step"].eq(w.step)]
        comm, comp = _comm_compute(ev, mode)
        rec = {"step": w.step, "start_us": w.start_us, "dur_us": w.dur_us, **_overlap(comm, comp)}
        rec.update(_bursts(comm, w.start_us, w.end_us, boundary_frac))
        for phase in ("forward_backward", "clip", "optimizer"):
            rec[f"{phase}_us"] = float(ev.loc[ev["name"].eq(phase), "dur"].sum())
        step_rows.append(rec)
        timed = ev[~ev["category"].isin(["step", "annotation", "fsdp"])]
        for row, g in timed.groupby("row"):
            s, e = merge_intervals(g["ts"].to_numpy(), g["end"].to_numpy())
            gaps = np.concatenate([[s[0] - w.start_us], s[1:] - e[:-1], [w.end_us - e[-1]]])
            gaps = gaps[gaps > 0]
            row_rows.append(
                {
                    "step": w.step,
                    "row": row,
                    "device": g["device"].iloc[0],
                    "busy_us": float((e - s).sum()),
                    "idle_us": float(max(w.dur_us - (e - s).sum(), 0.0)),
                    "busy_pct": 100 * float((e - s).sum()) / w.dur_us if w.dur_us else float("nan"),
                    "gaps": int(len(gaps)),
                    "longest_gap_us": float(gaps.max()) if len(gaps) else 0.0,
                    "comm_us": union_length(*_pick(g, "communication")),
                    "compute_us": union_length(*_pick(g, "compute" if mode == "gpu" else "cpu_op")),
                }
            )
    gathers = all_gathers(df)
    steps = pd.DataFrame(step_rows)
    return TraceReport(
        mode=mode,
        overall=overall,
        complete_steps=_sum_steps(steps.iloc[:-1] if len(steps) > 1 else steps),
        steps=steps,
        rows=pd.DataFrame(row_rows),
        gathers=gathers,
        prefetch=prefetch(df, gathers),
        notes=notes + gathers.attrs.get("notes", []),
    )


def _sum_steps(steps: pd.DataFrame) -> dict[str, float]:
    """Overlap over several steps: sums of their comm and overlap times (steps do not overlap)."""
    comm, over = float(steps["comm_us"].sum()), float(steps["overlap_us"].sum())
    return {
        "steps": [int(s) for s in steps["step"]],
        "compute_us": float(steps["compute_us"].sum()),
        "comm_us": comm,
        "overlap_us": over,
        "exposed_comm_us": comm - over,
        "overlap_pct": 100 * over / comm if comm else float("nan"),
    }


def _pick(g: pd.DataFrame, category: str) -> tuple[np.ndarray, np.ndarray]:
    sel = g[g["category"].eq(category)]
    return sel["ts"].to_numpy(), sel["end"].to_numpy()


def _bursts(comm: pd.DataFrame, start: float, end: float, frac: float) -> dict[str, float]:
    span = (end - start) * frac
    out = {}
    for label, lo, hi in (("head", start, start + span), ("tail", end - span, end)):
        s = np.clip(comm["ts"].to_numpy(), lo, hi)
        e = np.clip(comm["end"].to_numpy(), lo, hi)
        out[f"comm_{label}_us"] = union_length(s, e)
        out[f"collectives_{label}"] = int(((comm["ts"] < hi) & (comm["end"] > lo)).sum())
    return out


# ------------------------------------------------------------------------ FSDP all-gathers
def collective_kernels(df: pd.DataFrame) -> pd.DataFrame:
    """Every NCCL kernel of a GPU trace, attributed to the CPU code that launched it.

    A kernel and its launch (``cudaLaunchKernel*`` on a CPU thread) share a ``correlation`` id; the
    CPU ranges around the launch on that thread say what asked for the collective. Columns:
    ``step, kind, name, stream, start_us, dur_us`` (the kernel, GPU time), ``launch_us`` (CPU), ``op`` (the innermost
    communication op around the launch: ``nccl:all_reduce``, ``c10d::_allgather_base_``, ...),
    ``fsdp`` (the innermost ``FSDP::``/``FullyShardedDataParallel.`` range around it, or ""),
    ``layer`` (the decoder layer named by that range, ``model.layers.N``; -1 for none, which is the
    root group when ``fsdp`` is set) and ``unit``. FSDP2 runs each all-gather inside
    ``FSDP::all_gather (<fqn>)`` and each reduce-scatter inside ``FSDP::post_backward_reduce
    (<fqn>)``, so on FSDP2 traces every kernel gets its layer; FSDP1 names no layer (use the
    execution order, as :func:`all_gathers` does). Empty for CPU-only traces.
    """
    cols = "step kind name stream start_us dur_us launch_us op fsdp layer unit row".split()
    df = df if "step" in df else assign_steps(df)[0]
    kern = df[df["device"].eq("gpu") & df["category"].eq("communication") & df["cat"].eq("kernel")]
    if kern.empty:
        return pd.DataFrame(columns=cols)
    launches = df[df["category"].eq("runtime") & df["correlation"].isin(kern["correlation"])]
    launches = launches.drop_duplicates("correlation").set_index("correlation")
    # only the ranges that can explain a launch: communication ops and FSDP ranges, per thread
    ranges = df[df["device"].eq("cpu") & df["category"].isin(["communication", "fsdp"])]
    by_thread = {k: g for k, g in ranges.groupby(["pid", "tid"])}
    rows = []
    for k in kern.itertuples():
        op, fsdp_name, layer, launch = "", "", -1, k.ts
        if k.correlation in launches.index:
            la = launches.loc[k.correlation]
            launch = float(la["ts"])
            g = by_thread.get((la["pid"], la["tid"]))
            if g is not None:
                around = g[(g["ts"] <= la["ts"]) & (g["end"] >= la["end"])].sort_values("ts")
                comm = around[around["category"].eq("communication")]
                fs = around[around["category"].eq("fsdp")]
                op = comm["name"].iloc[-1] if len(comm) else ""
                if len(fs):  # a prefetch range of layer N encloses the all-gather of N+1: innermost wins
                    fsdp_name, layer = fs["name"].iloc[-1], int(fs["layer"].iloc[-1])
        unit = f"model.layers.{layer}" if layer >= 0 else ("root" if fsdp_name.startswith("FSDP::") else "")
        rows.append(
            {
                "step": k.step,
                "kind": k.kind,
                "name": k.name,
                "stream": k.stream,
                "start_us": k.ts,
                "dur_us": k.dur,
                "launch_us": launch,
                "op": op,
                "fsdp": fsdp_name,
                "layer": layer,
                "unit": unit,
                "row": k.row,
            }
        )
    return pd.DataFrame(rows, columns=cols).sort_values("start_us").reset_index(drop=True)


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
        notes.append(f"no FSDP unit in this trace: its {len(g)} all-gathers are not FSDP's")
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
    ``FSDP::backward_prefetch for model.layers.N`` ranges (layers listed), FSDP1's
    ``_pre_backward_prefetch`` / ``_pre_forward_prefetch`` ranges counted. ``fsdp``: whether the trace
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
    names = df.loc[df["name"].str.contains("prefetch", regex=False), "name"]
    layers = sorted({int(m) for m in names.str.extract(r"model\.layers\.(\d+)")[0].dropna()})
    return {
        "fsdp": bool(df["category"].eq("fsdp").any()),
        "transfers": int(len(xfer)),
        "concurrent_gathers": concurrent,
        "max_in_flight": in_flight,
        "annotated": int(len(names)),
        "annotated_layers": layers,
    }


def comm_by_row(df: pd.DataFrame) -> pd.DataFrame:
    """Communication and compute time (µs, interval union) per row over the whole trace."""
    out = []
    for row, g in df.groupby("row"):
        out.append(
            {
                "row": row,
                "device": g["device"].iloc[0],
                "comm_us": union_length(*_pick(g, "communication")),
                "compute_us": union_length(*_pick(g, "compute")),
                "cpu_op_us": union_length(*_pick(g, "cpu_op")),
                "events": len(g),
            }
        )
    return pd.DataFrame(out).sort_values("row").reset_index(drop=True)


def summarize_trace(path: str | Path) -> dict[str, Any]:
    """``load_trace`` + ``analyze`` as a JSON-ready dict (what ``smolfsdp analyze-trace --json`` prints)."""
    df = load_trace(path)
    report = analyze(df)
    return {
        "path": str(path),
        "events": len(df),
        **report.to_dict(),
        "by_row": json.loads(comm_by_row(df).to_json(orient="records")),
    }
