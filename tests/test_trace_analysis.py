"""smolfsdp.traces.analysis on real GPU traces (../shared/traces), on 2-rank CPU smoke traces of
FSDP1 and FSDP2 made here, on synthetic traces with known answers, and on broken files."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest
from conftest import ROOT, SHARED

from smolfsdp.traces import analysis as ta
from smolfsdp.traces.classify import _classify_one as classify_one

TRACES = SHARED / "traces"
DDP = TRACES / "ddp_2rank_a100_rank0.json.gz"


@pytest.fixture(scope="module")
def ddp_trace():
    if not DDP.is_file():
        pytest.skip(f"{DDP} is absent: the real GPU traces live in ../shared/traces/ (CI has them)")
    return ta.load_trace(DDP)


def _write(path, events, **extra):
    path.write_text(json.dumps({"traceEvents": events, **extra}))
    return path


def _x(name, ts, dur, cat="cpu_op", tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


# ----------------------------------------------------------------------- interval algebra
def test_interval_union_and_intersection_known_values():
    assert ta.union_length([0, 5, 30], [10, 20, 40]) == 30.0  # [0,20] + [30,40]
    a = (np.array([0.0, 30.0]), np.array([10.0, 40.0]))
    b = (np.array([5.0, 8.0]), np.array([9.0, 35.0]))  # ∪b = [5,35]
    assert ta.intersection_length(a, b) == 5.0 + 5.0


def test_synthetic_gpu_trace_overlap_and_steps(tmp_path):
    """Comm kernel [100,140] on stream 40, compute kernels [90,120] and [130,200] on stream 7:
    overlap 20+10 = 30 of 40 µs (75 %), exposed 10 µs; launches put both in ProfilerStep#1."""
    ev = [
        _x("ProfilerStep#1", 0, 80, cat="user_annotation"),
        _x("cudaLaunchKernel", 10, 1, cat="cuda_runtime", correlation=1),
        _x("cudaLaunchKernel", 20, 1, cat="cuda_runtime", correlation=2),
        _x("cudaLaunchKernel", 30, 1, cat="cuda_runtime", correlation=3),
        _x(
            "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)",
            100,
            40,
            cat="kernel",
            tid=40,
            stream=40,
            correlation=1,
        ),
        _x("void gemm_kernel<float>", 90, 30, cat="kernel", tid=7, stream=7, correlation=2),
        _x("void gemm_kernel<float>", 130, 70, cat="kernel", tid=7, stream=7, correlation=3),
    ]
    r = ta.analyze(ta.load_trace(_write(tmp_path / "t.json", ev)))
    s = r.steps.iloc[0]
    assert r.mode == "gpu" and int(s["step"]) == 1
    assert (s["comm_us"], s["overlap_us"], s["exposed_comm_us"], s["overlap_pct"]) == (40.0, 30.0, 10.0, 75.0)
    assert s["dur_us"] == 200.0  # the step window stretches to the end of its GPU work
    rows = r.rows.set_index("row")
    assert rows.loc["GPU 0 stream 7", "busy_us"] == 100.0 and rows.loc["GPU 0 stream 7", "gaps"] == 2
    assert r.prefetch["transfers"] == 1


def test_note_on_events_outside_every_step_counts_them_in_good_english(tmp_path):
    one = [_x("ProfilerStep#2", 0, 50, cat="user_annotation"), _x("aten::mm", 10, 5), _x("aten::add", 60, 5)]
    r = ta.analyze(ta.load_trace(_write(tmp_path / "one.json", one)))
    assert "1 event launched outside any ProfilerStep range is left out of per-step figures" in r.notes
    two = [*one, _x("aten::mul", 70, 5)]
    r = ta.analyze(ta.load_trace(_write(tmp_path / "two.json", two)))
    assert "2 events launched outside any ProfilerStep range are left out of per-step figures" in r.notes


def test_trace_without_step_annotation_is_one_span_and_says_so(tmp_path):
    ev = [_x("c10d::allreduce_", 0, 10), _x("gloo:all_reduce", 2, 20, tid=2), _x("aten::mm", 12, 8)]
    r = ta.analyze(ta.load_trace(_write(tmp_path / "t.json", ev)))
    assert any("no ProfilerStep" in n for n in r.notes)
    assert list(r.steps["step"]) == [-1]
    # CPU mode: comm = [0,22]; compute = aten::mm [12,20] -> 8 µs overlapped
    assert r.steps.iloc[0]["comm_us"] == 22.0 and r.steps.iloc[0]["overlap_us"] == 8.0


@pytest.mark.parametrize(
    "name",
    [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "void ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    ],
)
def test_nccl_kernel_name_forms_are_communication(name):
    cat, kind, _ = classify_one(name, "kernel")
    assert cat == "communication"
    if "AllGather" in name:
        assert kind == "all-gather"
    if "ReduceScatter" in name:
        assert kind == "reduce-scatter"


@pytest.mark.parametrize(
    ("name", "cat", "expected"),
    [
        ("c10d::_allgather_base_", "cpu_op", ("communication", "all-gather")),
        ("gloo:all_gather", "cpu_op", ("communication", "all-gather")),
        ("record_param_comms", "cpu_op", ("communication", "other")),
        ("c10d::_reduce_scatter_base_", "cpu_op", ("communication", "reduce-scatter")),
        ("FSDP::all_gather (model.layers.3)", "user_annotation", ("fsdp", "all-gather")),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", ("memory", "")),
        ("aten::mm", "cpu_op", ("cpu_op", "")),
        ("cudaLaunchKernel", "cuda_runtime", ("runtime", "")),
    ],
)
def test_event_classes(name, cat, expected):
    assert classify_one(name, cat)[:2] == expected


# bad input, layouts (CUDA/ROCm/old), strict JSON and memory: tests/test_trace_load.py


# ----------------------------------------------------------------------- real GPU traces
def test_ddp_trace_nccl_stream_and_compute_stream(ddp_trace):
    """The HTA test trace: NCCL kernels on stream 40, compute on stream 7."""
    by_row = ta.comm_by_row(ddp_trace).set_index("row")
    assert by_row.loc["GPU 0 stream 40", "comm_us"] > 40_000  # 46,876 µs of NCCL kernels
    assert by_row.loc["GPU 0 stream 40", "compute_us"] == 0
    assert by_row.loc["GPU 0 stream 7", "compute_us"] > 100_000  # 115,656 µs
    assert by_row.loc["GPU 0 stream 7", "comm_us"] == 0
    r = ta.analyze(ddp_trace)
    assert r.mode == "gpu" and list(r.steps["step"]) == [4, 5, 6]
    assert (r.steps["comm_us"] > 0).all() and (r.steps["overlap_pct"].between(5, 30)).all()


def test_overlap_matches_hta(ddp_trace, tmp_path):
    """Our comm/compute overlap against HTA's ``get_comm_comp_overlap`` on the same trace.

    HTA (0.5) by default drops the last ProfilerStep (its GPU work may be cut off) and every event
    launched after that step starts, so we compare with ``complete_steps`` (steps 4 and 5). On this
    trace that is 14.76 % for us and 14.31 % for HTA: 3 % apart (relative). The residual comes from
    HTA flooring nanosecond-resolution timestamps and durations to whole µs (it logs "Rounding down
    ns resolution events"), which opens sub-µs gaps between back-to-back compute kernels; flooring
    ours the same way gives 14.52 %. Over all three steps we find 15.61 %.
    """
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed (pip install -e .[dev])")
    from hta.trace_analysis import TraceAnalysis

    shutil.copy(DDP, tmp_path / DDP.name)  # HTA reads a whole folder of traces: give it a private one
    hta = TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    theirs = float(hta["comp_comm_overlap_pctg"].iloc[0])
    ours = ta.analyze(ddp_trace).complete_steps
    assert ours["steps"] == [4, 5]
    assert abs(ours["overlap_pct"] - theirs) / theirs < 0.05, (ours["overlap_pct"], theirs)
    assert abs(ours["overlap_pct"] - theirs) < 1.0  # the bar: within one percentage point


def test_nccl_heavy_bench_trace_every_kernel_attributed(tmp_path, ddp_trace):
    """The benchmark's NCCL-heavy trace (scripts/bench_trace_analysis.py), one copy: the 15 NCCL
    kernels of 100 µs or more split into 20 back-to-back pieces each, every piece launched inside the
    original ``nccl:*`` range. Every kernel is attributed to that range, and the union of
    communication (so the overlap) is the original trace's."""
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench_trace_analysis.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    info = bench.synthesize(DDP, copies=1, nccl_kernels=300, out=tmp_path / "big.json")
    assert (info["pieces"], info["nccl_kernels"]) == (20, 15 * 20 + 6)
    df = ta.load_trace(tmp_path / "big.json")
    k = ta.collective_kernels(df)
    assert (
        len(k) == 306
        and (k["op"] == k["kind"].map({"all-reduce": "nccl:all_reduce", "broadcast": "nccl:broadcast"})).all()
    )
    assert k.groupby("step").size().to_dict() == {4: 102, 5: 102, 6: 102}
    ours, orig = ta.analyze(df).complete_steps, ta.analyze(ddp_trace).complete_steps
    assert ours["comm_us"] == pytest.approx(orig["comm_us"], rel=1e-9)
    assert ours["overlap_pct"] == pytest.approx(orig["overlap_pct"], abs=1e-6)


def test_sampled_128rank_trace_sendrecv_on_its_own_stream():
    path = TRACES / "sampled_128rank_rank0.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is absent: the real GPU traces live in ../shared/traces/")
    by_row = ta.comm_by_row(ta.load_trace(path)).set_index("row")
    comm_rows = by_row[by_row["comm_us"] > 0].index
    assert "GPU 0 stream 7" not in comm_rows and len(comm_rows) >= 1
    assert by_row.loc["GPU 0 stream 7", "compute_us"] > 0


# --------------------------------------------------------------- CPU smoke traces, FSDP1/2
@pytest.fixture(scope="module", params=[1, 2], ids=["fsdp1", "fsdp2"])
def smoke_trace(request, tmp_path_factory):
    from smolfsdp.config import load_config
    from smolfsdp.launch.runner import run_benchmark
    from smolfsdp.paths import recipe

    out = tmp_path_factory.mktemp(f"fsdp{request.param}")
    cfg = load_config(
        recipe("smoke"),
        name="trace",
        output_dir=str(out),
        fsdp_version=request.param,
        benchmark_steps=4,
        profile=True,
    )
    bench = run_benchmark(cfg, timeout=300)
    assert len(bench["traces"]) == 2  # one per rank
    return request.param, ta.load_trace(bench["traces"][0])


def test_smoke_trace_every_layer_gathered_forward_and_backward(smoke_trace):
    """4 decoder layers: each is all-gathered once in forward and once in backward in every profiled
    step. FSDP2 names the layer in ``FSDP::all_gather (model.layers.N)``; FSDP1 on CPU annotates no
    layer, so its ``c10d::allgather_`` calls are labelled by execution order (root, 0..3; 3..0)."""
    version, df = smoke_trace
    r = ta.analyze(df)
    assert list(r.steps["step"]) == [2, 3, 4]  # wait=1, warmup=1, active=3 over 5 steps
    g = r.gathers
    assert set(g["source"]) == {"FSDP:: annotation" if version == 2 else "c10d op, by order"}
    for step in (2, 3, 4):
        for pass_ in ("forward", "backward"):
            layers = g[(g["step"] == step) & (g["pass"] == pass_) & (g["layer"] >= 0)]["layer"]
            assert sorted(layers) == [0, 1, 2, 3], (version, step, pass_)
    assert (g["dur_us"] > 0).all()


def test_smoke_trace_reduce_scatters_and_comm_time(smoke_trace):
    version, df = smoke_trace
    r = ta.analyze(df)
    rs = df[df["category"].eq("communication") & df["kind"].eq("reduce-scatter")]
    assert rs["name"].eq("c10d::_reduce_scatter_base_").sum() == 5 * 3  # 5 FSDP units x 3 steps
    assert (r.steps["comm_us"] > 0).all() and (r.steps["overlap_pct"].between(0, 100)).all()
    gloo_rows = r.rows[r.rows["row"].str.contains("gloo|python")]
    assert gloo_rows["comm_us"].max() > 0
    assert {"forward_backward_us", "clip_us", "optimizer_us"} <= set(r.steps.columns)
    assert (r.steps["forward_backward_us"] > 0).all()  # the record_function phases are in the trace
    if version == 2:
        assert r.prefetch["annotated_layers"] == [0, 1, 2, 3]  # FSDP::backward_prefetch for model.layers.N
    else:  # BACKWARD_PRE: in backward every unit but the first gathered prefetches the next one's parameters
        assert 0 < r.prefetch["annotated"] < r.prefetch["hook_ranges"]


def test_fsdp1_no_prefetch_trace_counts_no_prefetch(tmp_path):
    """FSDP1 enters its ``_pre_backward_prefetch`` / ``_pre_forward_prefetch`` hooks at every unit whatever
    the policy (issue 33: 45 "prefetches" under NO_PREFETCH); with ``NO_PREFETCH`` none of them gathers."""
    from smolfsdp.config import load_config
    from smolfsdp.launch.runner import run_benchmark
    from smolfsdp.paths import recipe

    cfg = load_config(
        recipe("smoke"), name="nopf", output_dir=str(tmp_path), fsdp_version=1, backward_prefetch="NO_PREFETCH",
        benchmark_steps=4, profile=True,
    )  # fmt: skip
    r = ta.analyze(ta.load_trace(run_benchmark(cfg, timeout=300)["traces"][0]))
    assert r.prefetch["hook_ranges"] > 0  # the hooks ran (and were recorded)
    assert r.prefetch["annotated"] == 0 and r.prefetch["annotated_layers"] == []


# ------------------------------------------------------------- NCCL kernels -> the code that ran them
def test_ddp_trace_every_nccl_kernel_traced_to_its_cpu_op(ddp_trace):
    """Each of the 21 NCCL kernels of the real DDP trace is found through its launch inside the
    ``nccl:*`` range that asked for it, and the kernel's kind agrees with that range's name."""
    k = ta.collective_kernels(ddp_trace)
    assert len(k) == 21 and list(k["stream"].unique()) == [40]
    assert (k["op"] == k["kind"].map({"all-reduce": "nccl:all_reduce", "broadcast": "nccl:broadcast"})).all()
    assert k["kind"].value_counts().to_dict() == {"all-reduce": 15, "broadcast": 6}
    assert k.groupby("step").size().to_dict() == {4: 7, 5: 7, 6: 7}
    assert (k["fsdp"] == "").all() and (k["unit"] == "").all()  # DDP: no FSDP range around any of them
    assert (k["launch_us"] <= k["start_us"]).all()  # launched on the CPU before it ran on the GPU


def _fsdp2_gpu_trace(n_layers: int = 2):
    """A GPU trace shaped like FSDP2's (hand-built test input, not a measurement): per unit a
    ``FSDP::all_gather (<fqn>)`` range launches one NCCL all-gather kernel on stream 20; backward
    prefetches layer N-1's gather inside layer N's ``FSDP::pre_backward`` range; each layer's
    ``FSDP::post_backward_reduce`` launches a reduce-scatter."""
    ev, corr, t = [_x("ProfilerStep#3", 0, 10_000, cat="user_annotation")], [0], [10]

    def gather(fqn, outer=None):
        corr[0] += 1
        t[0] += 100
        name = "FSDP::all_gather" + (f" ({fqn})" if fqn else "")
        if outer:
            ev.append(_x(outer, t[0] - 5, 60, cat="user_annotation"))
        ev.append(_x(name, t[0], 40, cat="user_annotation"))
        ev.append(_x("nccl:_all_gather_base", t[0] + 5, 20, cat="user_annotation"))
        ev.append(_x("cudaLaunchKernel", t[0] + 10, 2, cat="cuda_runtime", correlation=corr[0]))
        ev.append(
            _x(
                "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                t[0] + 50,
                30,
                cat="kernel",
                tid=20,
                stream=20,
                correlation=corr[0],
            )
        )

    gather("")  # root
    for i in range(n_layers):
        gather(f"model.layers.{i}")
    t[0] += 1000
    ev.append(_x("FSDP::pre_backward (model.layers.1)", t[0], 10, cat="user_annotation"))
    for i in reversed(range(n_layers)):
        gather(f"model.layers.{i}", outer=f"FSDP::pre_backward (model.layers.{min(i + 1, n_layers - 1)})")
        corr[0] += 1
        t[0] += 100
        ev.append(_x(f"FSDP::post_backward_reduce (model.layers.{i})", t[0], 40, cat="user_annotation"))
        ev.append(_x("cudaLaunchKernel", t[0] + 10, 2, cat="cuda_runtime", correlation=corr[0]))
        ev.append(
            _x(
                "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*)",
                t[0] + 60,
                30,
                cat="kernel",
                tid=20,
                stream=20,
                correlation=corr[0],
            )
        )
    ev.append(_x("void gemm_kernel<float>", 50, 5000, cat="kernel", tid=7, stream=7))
    return ev


def test_fsdp2_gpu_kernels_attributed_per_layer(tmp_path):
    df = ta.load_trace(_write(tmp_path / "fsdp2.json", _fsdp2_gpu_trace()))
    k = ta.collective_kernels(df)
    ag = k[k["kind"] == "all-gather"]
    assert list(ag["unit"]) == [
        "root",
        "model.layers.0",
        "model.layers.1",
        "model.layers.1",
        "model.layers.0",
    ]
    rs = k[k["kind"] == "reduce-scatter"]
    assert list(rs["unit"]) == ["model.layers.1", "model.layers.0"]
    assert (k["op"].isin(["nccl:_all_gather_base", ""])).all()
    g = ta.all_gathers(df)
    assert (g["source"] == "NCCL kernel, FSDP:: annotation").all()
    assert list(zip(g["unit"], g["pass"], strict=True)) == [
        ("root", "forward"),
        ("model.layers.0", "forward"),
        ("model.layers.1", "forward"),
        ("model.layers.1", "backward"),
        ("model.layers.0", "backward"),
    ]
    assert (g["dur_us"] == 30).all()  # the kernels' GPU time, not the CPU ranges' 40 µs


# ----------------------------------------------------------- all-gathers that are not FSDP's
def test_ddp_cpu_trace_has_no_fsdp_all_gathers(tmp_path):
    """The TRL engine with accelerate as shipped runs DDP on CPU (``accelerate_fsdp_on_cpu: false``): its
    trace holds all-gathers (the Trainer gathering metrics) but no ``FSDP::``/``FullyShardedDataParallel.``
    range, so none of them is an FSDP unit's. Measured here: 8 ``c10d::allgather_`` per step."""
    from smolfsdp.config import load_config
    from smolfsdp.launch.runner import run_benchmark
    from smolfsdp.paths import recipe

    cfg = load_config(
        recipe("smoke_trl"), name="ddp", output_dir=str(tmp_path), benchmark_steps=3, profile=True,
        profile_wait=0, max_length=128, too_long="truncate", accelerate_fsdp_on_cpu=False,
    )  # fmt: skip
    bench = run_benchmark(cfg, timeout=300)
    assert bench["strategy"] == "ddp"
    df = ta.load_trace(bench["traces"][0])
    assert not df["category"].eq("fsdp").any()
    r = ta.analyze(df)
    assert list(r.steps["step"]) == [1, 2, 3]  # wait=0, warmup=1, active=3 over 4 steps
    ops = ta.assign_steps(df)[0]
    ops = ops[ops["name"].eq("c10d::allgather_") & ops["step"].isin([1, 2, 3])]
    assert ops.groupby("step").size().to_dict() == {1: 8, 2: 8, 3: 8}
    g = ta.all_gathers(df)
    assert g.empty and list(g.columns) == [
        "step",
        "unit",
        "layer",
        "pass",
        "start_us",
        "dur_us",
        "source",
        "row",
    ]
    assert g.attrs["notes"] == ["no FSDP unit in this trace: its 24 all-gathers are not FSDP's"]
    assert g.attrs["notes"][0] in r.notes and r.gathers.empty
    assert not any("do not fit root" in n for n in r.notes)


def test_ddp_gpu_trace_has_no_fsdp_all_gathers(ddp_trace):
    """The real 2-rank DDP trace: NCCL all-reduces and broadcasts only, no FSDP range, no all-gather."""
    g = ta.all_gathers(ddp_trace)
    assert g.empty and g.attrs["notes"] == []
