"""The collectives a PyTorch profiler trace recorded, with their sizes: the check on ``smolfsdp.estimate.comm``.

The appendix "How the estimates are checked" (the model of chapter "Scaling out" against a trace): a profiled
smoke run's collectives per step, summed the way
``comm.step_bytes`` sums the model's, so the two can be compared row by row. Reads NCCL traces
(``record_param_comms`` carries sizes and dtypes) and gloo traces (the ``c10d::`` ops carry sizes
only when the profiler ran with ``record_shapes=True``).

    python -c "from smolfsdp import comm_trace; print(comm_trace.trace_step_bytes('runs/x/traces/rank0.json.gz'))"
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

import pandas as pd

from smolfsdp.errors import ConfigError
from smolfsdp.traces.load import read_trace

# --------------------------------------------------------------------------- trace check
_C10D_KIND = {
    "c10d::_allgather_base_": "all-gather",
    "c10d::allgather_": "all-gather",
    "c10d::allgather_into_tensor_coalesced_": "all-gather",
    "c10d::_reduce_scatter_base_": "reduce-scatter",
    "c10d::reduce_scatter_": "reduce-scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "c10d::allreduce_": "all-reduce",
    "c10d::allreduce_coalesced_": "all-reduce",
    "c10d::broadcast_": "broadcast",
}
_NCCL_KIND = {
    "allgather": "all-gather", "_allgather_base": "all-gather", "all_gather": "all-gather",
    "allgather_into_tensor_coalesced": "all-gather", "reduce_scatter": "reduce-scatter",
    "_reduce_scatter_base": "reduce-scatter", "reduce_scatter_tensor_coalesced": "reduce-scatter",
    "allreduce": "all-reduce", "allreduce_coalesced": "all-reduce", "broadcast": "broadcast",
}  # fmt: skip
_ITEMSIZE = {
    "float": 4, "Float": 4, "c10::BFloat16": 2, "BFloat16": 2, "c10::Half": 2, "Half": 2, "double": 8,
    "Double": 8, "long int": 8, "Long": 8, "int": 4, "Int": 4, "unsigned char": 1, "Byte": 1,
}  # fmt: skip


def _numel(dims) -> int:
    if not dims:
        return 1  # a 0-d tensor
    if isinstance(dims[0], list):
        return sum(_numel(d) for d in dims)
    return math.prod(dims)


def trace_collectives(path) -> pd.DataFrame:
    """The collectives a PyTorch profiler trace recorded, with their sizes; one row per call.

    Columns: ``step`` (``ProfilerStep#N``; -1 outside one), ``ts_us``, ``name``, ``kind``,
    ``group_size`` (when recorded), ``dtype`` (None when not recorded), ``itemsize``,
    ``numel`` (the full tensor, as :func:`estimate_collectives` counts it: all-gather output,
    reduce-scatter input, all-reduce buffer), ``bytes = numel * itemsize`` (NaN without a dtype).

    Two sources: NCCL runs record ``record_param_comms`` with ``Collective name``, ``In msg nelems``,
    ``Out msg nelems``, ``dtype``, ``Group size``; gloo runs record none, so the ``c10d::`` ops are read
    instead, which carry sizes only when the profiler ran with ``record_shapes=True`` (``Input Dims``,
    ``Input type``; a ``TensorList`` argument has no dtype). Raises TraceError (``smolfsdp.traces.load``)
    for unreadable files and ConfigError when the trace holds no sized collective.
    """
    header, events = read_trace(Path(path))
    xs = [e for e in events if e.get("ph") == "X"]
    steps = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0), int(e["name"].split("#")[1]))
        for e in xs
        if e.get("name", "").startswith("ProfilerStep#")
    )
    world = (header.get("distributedInfo") or {}).get("world_size")
    nccl = [e for e in xs if e.get("name") == "record_param_comms" and e.get("cat") != "kernel"]
    rows, seen = [], set()
    for e in nccl:
        a = e.get("args", {})
        kind = _NCCL_KIND.get(a.get("Collective name"))
        key = a.get("External id"), a.get("Collective name")
        if kind is None or key in seen:
            continue
        seen.add(key)
        n_in, n_out = int(a.get("In msg nelems", 0)), int(a.get("Out msg nelems", 0))
        numel = {"all-gather": n_out, "reduce-scatter": n_in}.get(kind, n_in)
        rows.append((e["ts"], "record_param_comms", kind, a.get("Group size"), a.get("dtype"), numel))
    if not rows:
        for e in xs:
            kind = _C10D_KIND.get(e.get("name"))
            a = e.get("args", {})
            if kind is None or "Input Dims" not in a:
                continue
            dims, types = a["Input Dims"], a.get("Input type", [])
            if e["name"] == "c10d::allgather_":  # (outputs [[...]], inputs [...]): input x world size
                numel, dtype = _numel(dims[1]) * (world or 0), None
            elif e["name"] in ("c10d::allreduce_", "c10d::broadcast_", "c10d::allreduce_coalesced_"):
                numel, dtype = _numel(dims[0]), None if types[0] == "TensorList" else types[0]
            elif kind == "all-gather":  # (output, input)
                numel, dtype = _numel(dims[0]), types[0]
            else:  # reduce-scatter (output, input)
                numel, dtype = _numel(dims[1]), types[1] if len(types) > 1 else None
            rows.append((e["ts"], e["name"], kind, world, dtype or None, numel))
    if not rows:
        raise ConfigError(
            f"{path}: no sized collectives. NCCL traces record them in record_param_comms; for gloo, "
            "profile with record_shapes=True (TrainConfig.record_shapes) so c10d ops carry Input Dims."
        )
    df = pd.DataFrame(rows, columns=["ts_us", "name", "kind", "group_size", "dtype", "numel"])
    starts = [s for s, _, _ in steps]

    def step_of(ts):
        i = bisect.bisect_right(starts, ts) - 1
        return steps[i][2] if i >= 0 and ts <= steps[i][1] else -1

    df.insert(0, "step", [step_of(t) for t in df["ts_us"]])
    df["itemsize"] = df["dtype"].map(lambda d: _ITEMSIZE.get(d, math.nan) if d else math.nan)
    df["bytes"] = df["numel"] * df["itemsize"]
    return df.sort_values("ts_us").reset_index(drop=True)


def trace_step_bytes(path, step: int | None = None) -> pd.DataFrame:
    """Per kind, for one profiled step (default: the first): collectives, elements and bytes, as
    :func:`step_bytes` reports the model (``numel_total``, ``logical_bytes``; NaN bytes where the trace
    has no dtype)."""
    df = trace_collectives(path)
    steps = sorted(s for s in df["step"].unique() if s >= 0)
    if not steps:
        raise ConfigError(f"{path}: no ProfilerStep#N range holds a collective; profile at least one step.")
    pick = steps[0] if step is None else step
    if pick not in steps:
        raise ConfigError(f"{path}: no step {pick}; profiled steps: {steps}.")
    g = df[df["step"] == pick].groupby("kind")
    out = pd.DataFrame(
        {"count": g.size(), "numel_total": g["numel"].sum(), "logical_bytes": g["bytes"].sum(min_count=1)}
    )
    out.loc[
        df[df["step"] == pick].groupby("kind")["bytes"].apply(lambda b: b.isna().any()), "logical_bytes"
    ] = math.nan
    return out
