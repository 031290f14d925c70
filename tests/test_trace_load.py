"""smolfsdp.traces.load: the Kineto layouts real profilers write (CUDA, ROCm, old PyTorch; int, decimal
or hex ids; numeric or text pids/tids; object or bare-array form), bad input refused with one clear
line (library and CLI), strict JSON output, a progress bar, and memory that stays bounded."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pandas as pd
import pytest
from conftest import SHARED

from smolfsdp import cli
from smolfsdp.traces import analysis as ta
from smolfsdp.traces import json_stream
from smolfsdp.traces import load as trace_load

TRACES = SHARED / "traces"
DDP = TRACES / "ddp_2rank_a100_rank0.json.gz"


def _x(name, ts, dur, cat="cpu_op", pid=0, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# ------------------------------------------------------------------------------ layouts
def _gpu_trace(style: str) -> list[dict]:
    """One step: an NCCL/RCCL all-reduce kernel [100,140] on stream 40 and compute kernels [90,120],
    [130,200] on stream 7, each launched inside ProfilerStep#1: 30 of 40 µs overlapped (75 %).

    ``style`` is what a given profiler writes (hand-built from Kineto's output formats, not recorded):
    ``cuda``: integer ids, pids, tids (the real A100 trace's layout); ``rocm``: what Kineto writes on
    AMD MI250 (the issue's trace): ``args.stream`` as hex strings ("0x28"), text pids/tids, ``hip*``
    runtime calls, Tensile/RCCL kernel names, ``gpu_user_annotation`` copies of CPU ranges; ``strings``:
    every id a decimal string and ts/dur numeric strings; ``legacy``: PyTorch 1.8's capitalised
    categories (``Kernel``, ``Runtime``, ``Operator``) and float pids/tids.
    """
    rocm = style == "rocm"
    sid = {"cuda": int, "rocm": hex, "strings": str, "legacy": int}[style]
    text = {"cuda": int, "rocm": str, "strings": str, "legacy": float}[style]
    cat = {"kernel": "Kernel", "cuda_runtime": "Runtime", "cpu_op": "Operator"} if style == "legacy" else {}
    launch = "hipLaunchKernel" if rocm else "cudaLaunchKernel"
    gemm = "Cijk_Ailk_Bljk_BBS_BH_MT128x128x32_MI32x32x8x1" if rocm else "void gemm_kernel<float>"
    nccl = "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)"

    def ev(name, ts, dur, c, tid, **args):
        e = _x(name, ts, dur, cat=cat.get(c, c), pid=text(0), tid=text(tid), **args)
        if style == "strings":
            e["ts"], e["dur"] = str(ts), str(dur)
        return e

    def kernel(name, ts, dur, stream, corr):
        return ev(name, ts, dur, "kernel", stream, stream=sid(stream), correlation=corr)

    out = [
        ev("ProfilerStep#1", 0, 80, "user_annotation", 1),
        ev("aten::mm", 5, 40, "cpu_op", 1),
        ev(launch, 10, 1, "cuda_runtime", 1, correlation=1),
        ev(launch, 20, 1, "cuda_runtime", 1, correlation=2),
        ev(launch, 30, 1, "cuda_runtime", 1, correlation=3),
        kernel(nccl, 100, 40, 40, 1),
        kernel(gemm, 90, 30, 7, 2),
        kernel(gemm, 130, 70, 7, 3),
    ]
    if rocm:  # a GPU-side label: not work, must not count as compute or communication
        out.append(ev("nccl:all_reduce", 100, 40, "gpu_user_annotation", 40, stream=sid(40)))
    return out


@pytest.mark.parametrize("form", ["object", "array"])
@pytest.mark.parametrize("style", ["cuda", "rocm", "strings", "legacy"])
def test_kineto_layouts_give_the_same_report(tmp_path, style, form):
    """Before this fix, the ROCm layout raised ``ValueError: invalid literal for int() ... '0x28'``."""
    events = _gpu_trace(style)
    doc = {"traceEvents": events, "deviceProperties": [{"id": 0}]} if form == "object" else events
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    df = ta.load_trace(path)
    r = ta.analyze(df)
    s = r.steps.iloc[0]
    assert r.mode == "gpu" and int(s["step"]) == 1
    assert (s["comm_us"], s["overlap_us"], s["overlap_pct"], s["dur_us"]) == (40.0, 30.0, 75.0, 200.0)
    rows = r.rows.set_index("row")
    assert rows.loc["GPU 0 stream 7", "busy_us"] == 100.0 and rows.loc["GPU 0 stream 40", "comm_us"] == 40.0
    k = ta.collective_kernels(df)
    assert list(k["kind"]) == ["all-reduce"] and list(k["launch_us"]) == [10.0] and list(k["stream"]) == [40]


def test_parse_id_forms():
    assert [trace_load.parse_id(v) for v in (7, 7.0, "7", "0x28", "0X1a", "stream 7", "07", None, "x")] == [
        7, 7, 7, 40, 26, 7, 7, -1, -1,
    ]  # fmt: skip


def test_gpu_event_without_stream_takes_it_from_its_text_tid(tmp_path):
    ev = [_x("void k()", 0, 5, cat="kernel", pid="0", tid="stream 0x3 "), _x("aten::mm", 0, 5)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    df = ta.load_trace(path)
    assert df.loc[df["device"] == "gpu", "row"].tolist() == ["GPU 0 stream 3"]


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.json.gz")), ids=lambda p: p.name)
def test_real_traces_load_every_complete_event(path):
    """Every shared real trace: as many rows as ``ph == "X"`` events with a ts, kernels on streams."""
    raw = json.loads(gzip.open(path).read())
    xs = [e for e in raw["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    df = ta.load_trace(path)
    assert len(df) == len(xs)
    assert df["ts"].sum() == pytest.approx(sum(e["ts"] for e in xs), rel=1e-12)
    kern = df[df["cat"] == "kernel"]
    assert len(kern) == sum(e.get("cat") == "kernel" for e in xs) and (kern["stream"] >= 0).all()
    assert df.attrs["distributed"] == raw.get("distributedInfo", {})


# ---------------------------------------------------------------------------- bad input
_FULL = json.dumps({"traceEvents": [_x("aten::mm" + "_long_name" * 5, 0, 5)] * 20})
BAD = {
    # name: (file bytes, gzip?, message pattern)
    "cut mid-string": (_FULL[:600].encode(), True, r"stops in the middle of a value at byte 600.*truncated"),
    "cut between events": (_FULL[: _FULL.index("}, {") + 3].encode(), False, r"at byte \d+.*truncated"),
    "gzip cut": (None, True, r"gzip stream ends after .* without its end marker: the file is truncated"),
    "not JSON": (b"this is not json", False, r"invalid JSON within its first 16 bytes .*not a JSON trace"),
    "array of numbers": (b"[1, 2, 3]", False, r"traceEvents item 0 is a int \('1'\), not an event object"),
    "array of strings": (b'["a", "b"]', False, r"item 0 is a str \('a'\), not an event object"),
    "object without traceEvents": (b'{"hello": 1}', False, r"without a traceEvents list \(keys: hello\)"),
    "traceEvents not a list": (b'{"traceEvents": {"a": 1}}', False, r"traceEvents is a map, expected a list"),
    "a number": (b"42", False, r"JSON number .* at the top, not a trace"),
    "empty file": (b"", False, r"empty file \(0 bytes\)"),
    "no complete events": (b'{"traceEvents": [{"ph": "M", "name": "x"}]}', False, r"no complete \('X'\) events"),
    "ts not a number": (json.dumps({"traceEvents": [_x("a", "soon", 1)]}).encode(), False,
                        r"an event field is unreadable .*expected numbers"),
    "args not an object": (json.dumps({"traceEvents": [{**_x("a", 1, 1), "args": [1]}]}).encode(), False,
                           r"an event field is unreadable"),
}  # fmt: skip


def _bad_file(tmp_path, name):
    data, gz, _ = BAD[name]
    if name == "gzip cut":
        full = gzip.compress(_FULL.encode())
        data, gz = full[: len(full) // 2], False
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_gets_one_clear_error(tmp_path, name):
    """Each names the file and the problem. Before this fix, 'cut mid-string' said "not a JSON trace"
    and 'array of numbers' raised AttributeError ('int' object has no attribute 'get')."""
    path = _bad_file(tmp_path, name)
    with pytest.raises(ta.TraceError, match=BAD[name][2]) as err:
        ta.load_trace(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name", ["cut mid-string", "array of numbers", "not JSON", "gzip cut"])
def test_cli_bad_input_prints_one_line_and_exits_2(tmp_path, capsys, name):
    assert cli.main(["analyze-trace", str(_bad_file(tmp_path, name))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smolfsdp: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        ta.load_trace(tmp_path / "missing.json")


# ------------------------------------------------------------------------- JSON, progress
def test_cli_json_is_strict_null_not_nan(tmp_path, capsys):
    """A trace without communication has no overlap %: ``null``. Before this fix: a bare ``NaN``."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [_x("ProfilerStep#1", 0, 50), _x("aten::mm", 5, 10)]}))
    assert cli.main(["analyze-trace", str(path), "--json"]) == 0
    out = capsys.readouterr().out

    def refuse(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    doc = json.loads(out, parse_constant=refuse)
    assert doc[0]["overall"]["overlap_pct"] is None and doc[0]["steps"][0]["overlap_pct"] is None
    assert doc[0]["steps"][0]["compute_us"] == 10.0


def test_progress_bar_on_stderr(tmp_path, capsys, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [_x("aten::mm", i, 1) for i in range(100)]}))
    monkeypatch.setattr(trace_load, "PROGRESS_DELAY_S", 0.0)  # the CLI's bar waits 2 s before showing
    ta.load_trace(path, progress=True)
    assert "reading t.json" in capsys.readouterr().err
    ta.load_trace(path)
    assert capsys.readouterr().err == ""  # off unless asked (library calls, notebooks, other ranks)


def test_memory_stays_far_below_a_json_load():
    """Streaming into columns: the Python heap's peak while loading the real DDP trace (40k events) is
    a fraction of what ``json.loads`` alone needs for it (the previous loader's first step)."""
    if not DDP.is_file():
        pytest.skip(f"{DDP} is absent: the real GPU traces live in ../shared/traces/")
    text = gzip.open(DDP).read()
    tracemalloc.start()
    doc = json.loads(text)
    whole = tracemalloc.get_traced_memory()[1]
    del doc
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    df = ta.load_trace(DDP)
    ours = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert len(df) == 26_933
    assert ours < 0.25 * whole, (ours / 1e6, whole / 1e6)  # measured: 6 MB vs 39 MB
    assert df.memory_usage(deep=True).sum() / len(df) < 150  # bytes per event, all columns


# ------------------------------------------------------------------- without ijson
@pytest.fixture
def no_ijson(monkeypatch):
    """The lent GPU machine's image has no ijson: load reads with smolfsdp.traces.json_stream."""
    monkeypatch.setattr(trace_load, "ijson", None)
    monkeypatch.setattr(json_stream, "CHUNK", 64)  # events straddle many chunk edges


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_without_ijson_gets_the_same_error(tmp_path, name, no_ijson):
    path = _bad_file(tmp_path, name)
    with pytest.raises(ta.TraceError, match=BAD[name][2]) as err:
        ta.load_trace(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("style", ["kineto", "bare"])
def test_standard_library_reader_gives_the_same_frame(tmp_path, style, monkeypatch):
    events = [_x(f"op{i}", i * 1.5, 1) for i in range(50)] + [{"ph": "M", "name": "thread_name", "args": {}}]
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events, "after": 1}
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc if style == "kineto" else events, indent=1).encode()))
    with_ijson = ta.load_trace(path)
    monkeypatch.setattr(trace_load, "ijson", None)
    monkeypatch.setattr(json_stream, "CHUNK", 64)
    header, _ = trace_load.read_trace(path)
    without = ta.load_trace(path)
    pd.testing.assert_frame_equal(without, with_ijson)
    assert without.attrs["distributed"] == ({"rank": 0} if style == "kineto" else {})
    assert header == ({"schemaVersion": 1, "distributedInfo": {"rank": 0}} if style == "kineto" else {})
    assert without["ts"].tolist() == [i * 1.5 for i in range(50)]
