"""What each trace event is: device, row (thread or stream), category, collective kind, decoder layer.

Used by ``smolfsdp.traces.load`` (every loaded trace is classified) and re-exported by
``smolfsdp.traces.analysis``. Each distinct (name, category) pair is classified once, then spread to
the events by code: traces repeat a few thousand names over hundreds of thousands of events.
:func:`collective_kind` names the collective of one c10d op (the probes, gotchas and seeds' code count them
from ``torch.profiler`` events).

GPU events: categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``gpu_user_annotation`` (CUDA and
ROCm Kineto alike). Communication kernels are NCCL's and RCCL's (``nccl`` in the name, as HTA's
``is_comm_kernel``: RCCL keeps NCCL's names, e.g. ``ncclDevKernel_Generic``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from smolfsdp.traces.intervals import merge_intervals

CPU_COMM_RE = re.compile(r"^(c10d::|_c10d_functional::|gloo:|nccl:|record_param_comms|ProcessGroup)")
NCCL_RE = re.compile(r"nccl", re.IGNORECASE)
FSDP_RE = re.compile(r"^(FSDP::|FullyShardedDataParallel\.)")
LAYER_RE = re.compile(r"model\.layers\.(\d+)")
KINDS = {
    "all-gather": re.compile(r"all_?gather", re.IGNORECASE),
    "reduce-scatter": re.compile(r"reduce_?scatter", re.IGNORECASE),
    "all-reduce": re.compile(r"all_?reduce", re.IGNORECASE),
    "broadcast": re.compile(r"broadcast", re.IGNORECASE),
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
TRAILING_INT = re.compile(r"(0x[0-9a-fA-F]+|\d+)\s*\)?\s*$")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")


# profiler op names of torch.distributed's c10d ops -> collective kind (CPU side, any backend)
COLLECTIVES = {
    "allgather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "allreduce": "all-reduce",
    "broadcast": "broadcast",
}


def collective_kind(name: str) -> str | None:
    """Map a profiler op name (``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``, ...) to a kind."""
    if not name.startswith("c10d::"):
        return None
    flat = name.replace("_", "").lower()
    for key, kind in COLLECTIVES.items():
        if key.replace("_", "") in flat:
            return kind
    return "other"


def parse_id(value: Any) -> int:
    """A stream or correlation id as an int: 7, 7.0, "7", "0x1a" (hex), "stream 7"; -1 when absent."""
    if isinstance(value, bool) or value is None:
        return -1
    if isinstance(value, (int, float)):
        return int(value)
    s = str(value).strip()
    try:
        return int(s, 16) if s[:2].lower() == "0x" else int(s)
    except ValueError:
        m = TRAILING_INT.search(s)
        return parse_id(m.group(1)) if m else -1


def _classify_one(name: str, cat: str) -> tuple[str, str, int]:
    """(category, kind, layer) of one event name in one trace category."""
    m = LAYER_RE.search(name)
    layer = int(m.group(1)) if m else -1
    kind = next((k for k, rx in KINDS.items() if rx.search(name)), "other")
    if cat == "kernel":
        if NCCL_RE.search(name):
            return "communication", kind, layer
        if name.startswith(("Memcpy", "Memset", "hipMemcpy", "hipMemset")):
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
    if cat == "user_annotation":
        return "annotation", "", layer
    if cat in RUNTIME_CATS:
        return "runtime", "", layer
    if cat in ("cpu_op", "python_function"):
        return "cpu_op", "", layer
    return "other", "", layer


def classify(df: pd.DataFrame, thread_names: dict | None = None) -> pd.DataFrame:
    """Add ``device, row, category, kind, layer, in_comm`` (see ``trace_load.load_trace``).

    ``df`` has the loader's columns (``name, cat, pid, tid``, text or categorical; ``ts, end``,
    ``stream``); ``thread_names`` maps ``(pid, tid)`` text to the trace's thread names.
    """
    for col in ("name", "cat", "pid", "tid"):  # a frame built by hand: text -> categorical, as loaded
        if not isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = df[col].astype(str).astype("category")
    name, cat = df["name"].cat, df["cat"].cat
    gpu = np.isin(cat.codes.to_numpy(), [i for i, c in enumerate(cat.categories) if c in GPU_CATS])
    # a GPU event without args.stream is on the stream its tid names (Kineto's GPU rows are streams)
    tid_ids = np.array([parse_id(t) for t in df["tid"].cat.categories] + [-1], dtype=np.int64)
    stream = df["stream"].to_numpy()
    stream = np.where(gpu & (stream < 0), tid_ids[df["tid"].cat.codes.to_numpy()], stream)
    df["device"] = pd.Categorical.from_codes(gpu.astype(np.int8), categories=["cpu", "gpu"])
    df["stream"] = stream
    df["row"] = _rows(df, gpu, stream, thread_names or {})
    # classify each distinct (name, cat) once
    n_cat = max(len(cat.categories), 1)
    pair = name.codes.to_numpy().astype(np.int64) * n_cat + cat.codes.to_numpy()
    uniq, inverse = np.unique(pair, return_inverse=True)
    cls = [_classify_one(name.categories[p // n_cat], cat.categories[p % n_cat]) for p in uniq]
    category = np.array([CATEGORIES.index(c[0]) for c in cls], dtype=np.int8)[inverse]
    kinds = ["", "other", *KINDS]
    kind = np.array([kinds.index(c[1]) for c in cls], dtype=np.int8)[inverse]
    df["category"] = pd.Categorical.from_codes(category, categories=list(CATEGORIES))
    df["kind"] = pd.Categorical.from_codes(kind, categories=kinds)
    df["layer"] = np.array([c[2] for c in cls], dtype=np.int64)[inverse]
    df["in_comm"] = _nested_in(df, df["category"].eq("communication").to_numpy() & ~gpu)
    return df


def _rows(df: pd.DataFrame, gpu: np.ndarray, stream: np.ndarray, thread_names: dict) -> pd.Categorical:
    """Row labels: ``GPU <pid> stream <n>`` for GPU events, the thread's name (or ``thread <tid>``)."""
    pid, tid = df["pid"].cat, df["tid"].cat
    keys = pd.DataFrame(
        {"gpu": gpu, "pid": pid.codes, "x": np.where(gpu, stream, tid.codes.astype(np.int64))}
    )
    codes = keys.groupby(["gpu", "pid", "x"], sort=False).ngroup().to_numpy()
    labels = []
    for g, p, x in keys.drop_duplicates().itertuples(index=False):
        p_text = pid.categories[p]
        if g:
            labels.append(f"GPU {p_text} stream {x}")
        else:
            t_text = tid.categories[x]
            labels.append(thread_names.get((p_text, t_text)) or f"thread {t_text}")
    uniq = list(dict.fromkeys(labels))  # threads of one name share a row
    return pd.Categorical.from_codes(np.array([uniq.index(lb) for lb in labels])[codes], categories=uniq)


def _nested_in(df: pd.DataFrame, outer: np.ndarray) -> np.ndarray:
    """True for events lying inside one of the ``outer`` events on the same row (outer ones included)."""
    result = np.zeros(len(df), dtype=bool)
    rows = df["row"].cat.codes.to_numpy()
    ts, end = df["ts"].to_numpy(), df["end"].to_numpy()
    for row in np.unique(rows[outer]):
        s, e = merge_intervals(ts[outer & (rows == row)], end[outer & (rows == row)])
        sel = np.flatnonzero(rows == row)
        k = np.searchsorted(s, ts[sel], side="right") - 1
        ok = k >= 0
        result[sel[ok]] = end[sel[ok]] <= e[k[ok]]
    return result
