"""smolfsdp.traces.sanity and the loader's bounds: crafted variants of the real traces in
../shared/traces (written to tmp_path, never committed) with impossible times, kernels launched before
recording, same-stream overlap and device kinds we do not analyse, each counted and noted; and gzip
bombs refused within bounded time and memory, with one line and exit 2."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc

import pytest
from conftest import SHARED

from smolfsdp import cli
from smolfsdp.cli_output import format_trace
from smolfsdp.traces import analysis as ta

TRACES = SHARED / "traces"
DDP = TRACES / "ddp_2rank_a100_rank0.json.gz"
SAMPLED = TRACES / "sampled_128rank_rank0.json.gz"
STEP6_COMM_US = 22587.4423828125  # step 6 of the untouched DDP trace (test_trace_analysis checks the rest)


def _raw(path):
    if not path.is_file():
        pytest.skip(f"{path} is absent: the real GPU traces live in ../shared/traces/ (CI has them)")
    return json.loads(gzip.open(path).read())


def _launch_steps(events):
    """Correlation id -> (step, launch ts) of every recorded launch, by the ProfilerStep ranges."""
    marks = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
                   if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))  # fmt: skip
    out = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and "correlation" in (e.get("args") or {}):
            step = next((s for a, b, s in marks if a <= e["ts"] <= b), None)
            out[e["args"]["correlation"]] = (step, e["ts"])
    return out


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """The DDP trace with: step 5's kernels at ts 0 / dur 0, one step-4 kernel with a negative duration and
    one with 1e300, a CPU op at ts 1e400, a step-6 kernel 50 µs before its launch, another moved to start
    3 µs before its predecessor on stream 7 ends, the launches of every correlation id before the middle
    of step 4's compute kernels dropped (as if recording started after them), and 5 CUPTI range-profiler events."""
    raw = _raw(DDP)
    ev = raw["traceEvents"]
    launches = _launch_steps(ev)
    work = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = [e for e in work if e["cat"] == "kernel"]
    step_of = {id(k): launches.get(k["args"]["correlation"], (None, None)) for k in work}
    expect = {"zero": 0, "excluded": {4: 0, 5: 0, 6: 0}}
    for k in kernels:
        if step_of[id(k)][0] == 5:
            k["ts"], k["dur"] = 0, 0
            expect["zero"] += 1
    compute4 = [k for k in kernels if step_of[id(k)][0] == 4 and "nccl" not in k["name"].lower()]
    compute4[-10]["dur"], compute4[-20]["dur"] = -5, 1e300  # launched after the cut below
    next(e for e in ev if e.get("cat") == "cpu_op")["ts"] = "1e400"
    stream7 = sorted((k for k in work if step_of[id(k)][0] == 6 and k["args"].get("stream") == 7),
                     key=lambda k: k["ts"])  # fmt: skip
    early = stream7[30]
    early["ts"] = step_of[id(early)][1] - 50
    prev, lap = next(
        (p, k) for p, k in zip(stream7[100:], stream7[101:], strict=False)
        if k["ts"] - (p["ts"] + p["dur"]) > 5 and k["dur"] > 5 and p["ts"] + p["dur"] - 3 > step_of[id(k)][1] + 2
    )  # fmt: skip
    lap["ts"] = prev["ts"] + prev["dur"] - 3
    cut = compute4[len(compute4) // 2]["args"]["correlation"]  # recording "starts" mid-step 4
    raw["traceEvents"] = [
        e for e in ev
        if not (e.get("cat") == "cuda_runtime" and (e.get("args") or {}).get("correlation", 1e18) < cut)
    ]  # fmt: skip
    before = [
        e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        and e["args"].get("correlation", 1e18) < cut
    ]  # fmt: skip
    expect["before_recording"] = len(before)
    pid, tid = ev[0].get("pid", 0), ev[0].get("tid", 0)
    raw["traceEvents"] += [
        {"ph": "X", "cat": "cuda_profiler_range", "name": f"range {i}", "pid": pid, "tid": tid,
         "ts": early["ts"] + i, "dur": 1} for i in range(5)
    ]  # fmt: skip
    path = tmp_path_factory.mktemp("crafted") / "crafted.json"
    path.write_text(json.dumps(raw))
    return ta.summarize_trace(path), expect


def test_impossible_times_counted_named_and_left_out(crafted):
    s, expect = crafted
    imp = s["data_quality"]["impossible_times"]
    assert {k: v["events"] for k, v in imp.items()} == {
        "zero": expect["zero"], "negative": 1, "overflowing": 2, "before its launch": 1,
    }  # fmt: skip
    assert sum(imp["zero"]["names"].values()) <= expect["zero"] and imp["zero"]["names"]  # named
    steps = {r["step"]: r for r in s["steps"]}
    # step 5's kernels are all impossible: each placed by its sound launch, none summed
    assert steps[5]["excluded_events"] == expect["zero"]
    assert steps[5]["comm_us"] == 0.0 and steps[5]["compute_us"] == 0.0
    assert steps[4]["excluded_events"] == 2 and steps[6]["excluded_events"] == 1  # the 1e400 start: nowhere
    assert steps[6]["comm_us"] == pytest.approx(STEP6_COMM_US, rel=1e-9)  # untouched communication
    # the empty step 5 never stands in for a real one: HTA's window (all but the last) would be 4 and 5
    assert s["complete_steps"]["steps"] == [4] and s["data_quality"]["empty_steps"] == [5]
    notes = " | ".join(s["notes"])
    assert f"{expect['zero'] + 4:,} events with impossible times are left out of every figure" in notes
    assert "step 5 recorded no compute and no communication while other steps did" in notes
    text = format_trace(s)
    assert "excluded events" in text.splitlines()[4]  # the per-step table's header marks the steps
    json.dumps(s, allow_nan=False)  # still strict JSON


def test_pre_recording_kernels_overlap_and_unsupported_kinds_noted(crafted):
    s, expect = crafted
    notes = " | ".join(s["notes"])
    assert f"{expect['before_recording']:,} GPU events (" in notes
    assert "launched before recording started" in notes and "counted into step 4" in notes
    lap = s["data_quality"]["same_stream_overlap"]
    assert lap["events"] == 1 and lap["streams"] == [7] and lap["overlap_us"] == pytest.approx(3.0, abs=1e-3)
    assert "1 GPU event started before the previous work on the same stream ended (3.0 µs" in notes
    assert format_trace(s).startswith(f"== {s['path']} (GPU trace, ")  # range-profiler events: a note only
    kinds = s["data_quality"]["unsupported_device_kinds"]
    assert kinds == {"CUPTI range profiler": {"events": 5, "categories": {"cuda_profiler_range": 5}}}
    assert "device events of kind CUPTI range profiler are not analysed: 5 events" in notes


def test_mtia_trace_is_not_called_a_cpu_trace(tmp_path):
    raw = _raw(SAMPLED)
    rename = {"kernel": "mtia_ccp_events", "cuda_runtime": "mtia_runtime"}
    n = sum(e.get("cat") in rename and e.get("ph") == "X" for e in raw["traceEvents"])
    for e in raw["traceEvents"]:
        e["cat"] = rename.get(e.get("cat"), e.get("cat"))
    path = tmp_path / "mtia.json"
    path.write_text(json.dumps(raw))
    s = ta.summarize_trace(path)
    assert s["data_quality"]["unsupported_device_kinds"]["MTIA"]["events"] == n
    assert f"device events of kind MTIA are not analysed: {n:,} events" in " | ".join(s["notes"])
    assert format_trace(s).splitlines()[0].endswith(f"(CPU side of a MTIA trace, {s['events']:,} events)")


def test_issue_zeroed_second_half_is_not_analysed_as_sound(tmp_path):
    """The issue's case: ts 0 and dur 0 on the second half of the events (file order)."""
    raw = _raw(DDP)
    xs = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    for e in xs[len(xs) // 2 :]:
        e["ts"], e["dur"] = 0, 0
    path = tmp_path / "zeroed.json"
    path.write_text(json.dumps(raw))
    s = ta.summarize_trace(path)
    assert s["data_quality"]["impossible_times"]["zero"]["events"] == len(xs) - len(xs) // 2
    assert all(r["dur_us"] > 200_000 for r in s["steps"])  # no 0.0 ms step: the marks were sound
    assert s["mode"] == "gpu"  # its kernels were zeroed, not absent
    assert "no step recorded compute or communication that could be analysed" in s["notes"]


def test_zeroed_half_names_lost_events_and_vanished_steps(tmp_path):
    """The zeroed second half again (issue 34): the steps whose events were zeroed count them under
    ``excluded_events`` where a sound partner (launch or kernel) names the step, the rest are counted as
    unplaced, and a ProfilerStep range that was zeroed is named as a step not analysed."""
    raw = _raw(DDP)
    xs = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    zeroed = xs[len(xs) // 2 :] + [e for e in xs if e["name"] == "ProfilerStep#5"]  # and one step's range
    gone = sorted(int(e["name"].split("#")[1]) for e in zeroed if e["name"].startswith("ProfilerStep#"))
    for e in zeroed:
        e["ts"], e["dur"] = 0, 0
    path = tmp_path / "zeroed.json"
    path.write_text(json.dumps(raw))
    s = ta.summarize_trace(path)
    dq, notes = s["data_quality"], " | ".join(s["notes"])
    assert gone and dq["missing_steps"] == gone and {r["step"] for r in s["steps"]}.isdisjoint(gone)
    assert (
        f"step{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}: the ProfilerStep range has" in notes
    )
    # every zeroed event is either counted by a step or counted as unplaced (main: 0 everywhere, unnamed)
    zero = dq["impossible_times"]["zero"]["events"]
    assert sum(r["excluded_events"] for r in s["steps"]) + dq["unplaced_events"] == zero
    assert (
        dq["unplaced_events"] > 0
        and f"{dq['unplaced_events']:,} of the events with impossible times" in notes
    )


def test_overlapping_steps_noted_with_their_sum(tmp_path):
    """ProfilerStep#5 moved to start inside step 4: the two windows overlap, and the step durations add up
    past the span the steps cover; the note and ``overlapping_steps`` say by how much."""
    raw = _raw(DDP)
    marks = {e["name"]: e for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    m4, m5 = marks["ProfilerStep#4"], marks["ProfilerStep#5"]
    shift = m4["dur"] / 2
    m5["ts"], m5["dur"] = m5["ts"] - shift, m5["dur"] + shift
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps(raw))
    s = ta.summarize_trace(path)
    o = s["data_quality"]["overlapping_steps"]
    # step 5 now claims the launches in the shared part, so step 4's GPU tail shrinks a little
    assert (4, 5) in [tuple(p) for p in o["steps"]] and 0.99 * shift <= o["overlap_us"] <= shift
    durs = sum(r["dur_us"] for r in s["steps"])
    span = max(r["start_us"] + r["dur_us"] for r in s["steps"]) - min(r["start_us"] for r in s["steps"])
    assert durs > span and durs == pytest.approx(span + o["overlap_us"], abs=100.0)  # (gaps: tens of µs)
    assert "of steps overlap (" in " | ".join(s["notes"])


def test_all_steps_figures_leave_out_kernels_launched_before_recording(crafted):
    """The crafted trace's kernels launched before recording (no launch in the trace, correlation ids below
    the first recorded one) are in no step; the whole-trace ("all steps") figures leave them out too: equal
    to the figures of the same trace with those kernels deleted."""
    s, expect = crafted
    df = ta.load_trace(s["path"])
    launched = df.loc[df["category"].eq("runtime") & df["correlation"].ge(0), "correlation"]
    early = df["device"].eq("gpu") & df["correlation"].ge(0) & df["correlation"].lt(launched.min())
    assert int(early.sum()) == expect["before_recording"] > 0
    with_early, without = ta.analyze(df).overall, ta.analyze(df[~early].reset_index(drop=True)).overall
    assert with_early == pytest.approx(without, rel=1e-12, nan_ok=True)
    assert with_early["compute_us"] > 0


# ------------------------------------------------------------------------------ input bounds
def _bomb(path, body: bytes, copies: int, head=b'{"traceEvents": [', tail=b"]}"):
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head)
        for _ in range(copies):
            f.write(body)
        f.write(tail)
    return path


def _error_lines(capsys) -> list[str]:
    """stderr's lines but the progress bar's (a read slower than 2 s shows one, then clears it)."""
    lines = capsys.readouterr().err.splitlines()
    return [ln for ln in lines if ln.strip() and not ln.startswith("reading ")]


@pytest.mark.parametrize(
    ("body", "copies", "var", "limit", "what"),
    [
        (b'{"ph":"X","name":"a","ts":1,"dur":1},', 100_000, "SMOLFSDP_TRACE_MAX_BYTES", 1_000_000, "bytes"),
        (b" " * 65_536, 128, "SMOLFSDP_TRACE_MAX_BYTES", 1_000_000, "bytes"),  # whitespace: valid, endless
        (b'{"ph":"X","name":"a","ts":1,"dur":1},', 100_000, "SMOLFSDP_TRACE_MAX_EVENTS", 1_000, "events"),
    ],
    ids=["tiny-events", "whitespace", "event-count"],
)
def test_gzip_bomb_refused_in_bounded_time_and_memory(
    tmp_path, monkeypatch, capsys, body, copies, var, limit, what
):
    path = _bomb(tmp_path / "bomb.json.gz", body, copies)
    assert path.stat().st_size < 100_000  # small on disk, over the lowered limit once decompressed
    monkeypatch.setenv(var, str(limit))
    tracemalloc.start()
    t0 = time.perf_counter()
    rc = cli.main(["analyze-trace", str(path)])
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = _error_lines(capsys)
    assert rc == 2 and len(err) == 1
    assert f"more than {limit:,} {what}" in err[0] and f"{var}={4 * limit}" in err[0]
    assert took < 20 and peak < 50 * 2**20  # stopped at the limit, not at the end of the file


def test_huge_header_string_refused(tmp_path, monkeypatch, capsys):
    path = _bomb(tmp_path / "header.json.gz", b"a" * 65_536, 64, head=b'{"deviceProperties": "', tail=b'"}')
    monkeypatch.setenv("SMOLFSDP_TRACE_MAX_BYTES", "1000000")
    assert cli.main(["analyze-trace", str(path)]) == 2
    err = _error_lines(capsys)
    assert len(err) == 1 and "more than 1,000,000 bytes once decompressed" in err[0]


def test_bad_limit_named(tmp_path, monkeypatch, capsys):
    path = _bomb(tmp_path / "t.json.gz", b'{"ph":"X","name":"a","ts":1,"dur":1},', 3)
    monkeypatch.setenv("SMOLFSDP_TRACE_MAX_EVENTS", "lots")
    assert cli.main(["analyze-trace", str(path)]) == 2
    assert "SMOLFSDP_TRACE_MAX_EVENTS='lots' is not a number" in capsys.readouterr().err
