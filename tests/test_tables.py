"""smolfsdp.book.tables on real frames (the real GPU trace's analysis in ../shared/traces), the seed's
checks computed in smolfsdp.traces.seed_reading, and the chapter sentences of smolfsdp.book.profiling."""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED

from smolfsdp.book import profiling, tables
from smolfsdp.measure.benchmark import peak_tflops
from smolfsdp.probes.measured import memory_check_view, model_vs_trace_sentence
from smolfsdp.traces import analysis as ta
from smolfsdp.traces import seed_reading as checks

DDP = SHARED / "traces" / "ddp_2rank_a100_rank0.json.gz"
REPR = re.compile(r"[{}\[\]]|\bnan\b|\bNone\b|e\+0", re.I)  # what a reader must never see in a cell


@pytest.fixture(scope="module")
def gpu():
    if not DDP.is_file():
        pytest.skip(f"{DDP} is absent: the real GPU traces live in ../shared/traces/ (CI has them)")
    df = ta.load_trace(DDP)
    return df, ta.analyze(df)


def _cells(styler) -> list[str]:
    return [str(v) for v in styler.data.to_numpy().ravel()] + [str(c) for c in styler.data.columns]


def test_cell_text_never_shows_a_repr():
    assert tables.cell_text(1296.968774) == "1,296.97"
    assert tables.cell_text(1296.968774, 0) == "1,297"
    assert tables.cell_text(1234567) == "1,234,567"
    assert tables.cell_text(float("nan")) == tables.cell_text(None) == "—"
    assert tables.cell_text([0, 1, 2, 3]) == "0, 1, 2, 3"
    assert tables.cell_text({"rank0": -11, "ok_now": True}) == "rank0: -11; ok now: yes"
    assert tables.cell_text([]) == "—"
    assert tables.cell_text(3.2e-8) == "3.2 × 10⁻⁸" and tables.cell_text(0.0) == "0.00"  # never a false 0.00
    assert tables.scientific_text(0.0041729, digits=2) == "4.17 × 10⁻³" and tables.scientific_text(0.0) == "0"
    assert tables.readable_name("fsdp1_summon") == "FSDP1 summon"


def test_reader_frame_scales_and_labels_real_trace_steps(gpu):
    _, report = gpu
    steps = report.steps.set_index("step")
    frame = tables.reader_frame(steps[["dur_us", "comm_us", "overlap_pct", "collectives_head"]])
    assert list(frame.columns) == ["dur (ms)", "comm (ms)", "overlap (%)", "collectives head"]
    assert frame["dur (ms)"].tolist() == pytest.approx((steps["dur_us"] / 1e3).tolist())
    assert frame.index.name == "step" and list(frame.index) == [4, 5, 6]
    text = tables.format_frame(frame)
    # ~222 ms steps: typical value >= 100 -> 0 decimals; the same decimals for every row of a column
    assert text["dur (ms)"].tolist() == [f"{v / 1e3:,.0f}" for v in steps["dur_us"]]
    assert text["overlap (%)"].tolist() == [f"{v:.1f}" for v in steps["overlap_pct"]]
    assert text["collectives head"].tolist() == ["2", "2", "2"]


def test_bytes_columns_get_a_binary_unit():
    frame = tables.reader_frame(
        pd.DataFrame({"rss_peak_bytes": [631187072, 628074112], "tensor_bytes": [6956116, 10]})
    )
    assert list(frame.columns) == ["RSS peak (MiB)", "tensor (MiB)"]
    assert frame.iloc[0, 0] == pytest.approx(631187072 / 2**20)
    rates = tables.reader_frame(
        pd.DataFrame({"tokens_per_s": [612.4], "step_time_ms": [2957.1], "wall_s": [3.0]})
    )
    assert list(rates.columns) == ["tokens/s", "step time (ms)", "wall (s)"]  # "_per_s" before "_s"


def test_show_wraps_long_text_and_refuses_wide_tables(gpu):
    df, report = gpu
    by_row = ta.comm_by_row(df)
    long = "x" * 300
    by_row.loc[0, "row"] = long
    html = tables.show(
        tables.reader_frame(by_row[["row", "device", "comm_us", "compute_us", "events"]])
    ).to_html()
    assert long in html  # the whole text is there, wrapped by the browser, never cut with "..."
    assert "white-space: normal" in html and "..." not in html
    assert not REPR.search(" ".join(_cells(tables.show(tables.reader_frame(by_row)))))
    with pytest.raises(ValueError, match="split them with tables.split_wide"):
        tables.show(report.steps)  # 15 columns


def test_split_wide_and_to_long_on_real_steps(gpu):
    _, report = gpu
    parts = tables.split_wide(report.steps, keep=["step"])
    assert all(len(p.columns) <= tables.MAX_COLUMNS and p.columns[0] == "step" for p in parts)
    assert sorted({c for p in parts for c in p.columns}) == sorted(report.steps.columns)
    with pytest.raises(ValueError, match="not there"):
        tables.split_wide(report.steps, keep=["no_such"])
    long = tables.to_long(report.steps[["step", "dur_us", "comm_us"]], "step")
    assert list(long.columns) == [4, 5, 6] and list(long.index) == ["dur_us", "comm_us"]


def test_seed_checks_and_exposed_share_on_the_real_gpu_trace(gpu):
    _, report = gpu
    c = checks.seed_checks(report)
    assert list(c.index) == [4, 5, 6]
    assert c["compute_row_busy_pct"].tolist() == pytest.approx(
        report.rows[report.rows["row"] == "GPU 0 stream 7"]["busy_pct"].tolist()
    )
    s = checks.exposed_share(report)
    assert s["steps"] == [4, 5]
    assert s["exposed_pct"] == pytest.approx(100 - s["overlap_pct"])
    assert 84 < s["exposed_pct"] < 86  # the real DDP run hides ~15 % of its NCCL time
    sentence = profiling.gpu_overlap_sentence(report, hta_pct=None)
    assert f"**{s['exposed_pct']:.0f} % of the NCCL time is exposed**" in sentence
    assert "This trace is DDP" in sentence and "opposite of the seed" not in sentence
    assert "needs an FSDP trace from two or more GPUs" in sentence
    assert not REPR.search(sentence.replace("[", "").replace("]", ""))
    with pytest.raises(ValueError, match="complete_steps"):
        checks.exposed_share(report, "all")


def test_show_keeps_step_numbers_that_do_not_start_at_zero(gpu):
    """Steps 4, 5, 6 make a RangeIndex(start=4) in pandas: show() once hid it as if it were 0..n-1."""
    _, report = gpu
    parts = profiling.trace_step_tables(report)
    comm = parts["communication"]
    assert isinstance(comm.index, pd.RangeIndex) and list(comm.index) == [4, 5, 6]
    shown = tables.show(tables.reader_frame(comm))
    assert list(shown.data.columns[:2]) == ["step", "step time (ms)"]
    assert list(shown.data["step"]) == ["4", "5", "6"]
    steps = report.steps.set_index("step")
    assert comm["step_time_us"].tolist() == steps["dur_us"].tolist()
    assert list(tables.reader_frame(parts["phases"]).columns)[0] == "step time (ms)"
    assert "step" not in tables.show(pd.DataFrame({"a": [1.0, 2.0]})).data.columns  # plain 0..n-1: hidden
    assert tables.is_plain_range(pd.RangeIndex(3)) and not tables.is_plain_range(pd.RangeIndex(2, 5))
    assert not tables.is_plain_range(pd.RangeIndex(3, name="step"))
    assert not tables.is_plain_range(pd.RangeIndex(0, 6, 2))


def test_seed_checks_header_says_exposed_comm_is_a_share_of_the_step(gpu):
    _, report = gpu
    c = checks.seed_checks(report)
    steps = report.steps.set_index("step")
    assert c["exposed_comm_pct_of_step"].tolist() == pytest.approx(
        (100 * steps["exposed_comm_us"] / steps["dur_us"]).tolist()
    )
    shown = tables.show(tables.reader_frame(c))
    assert "exposed comm (% of step)" in shown.data.columns and list(shown.data["step"]) == ["4", "5", "6"]
    mean = c["exposed_comm_pct_of_step"].mean()
    assert f"{mean:.0f} % of the step is communication" in profiling.seed_check_sentence(report)


def test_busy_rows_drop_the_rows_that_did_no_work(gpu):
    df, _ = gpu
    kept, note = profiling.busy_rows(df)
    assert list(kept["row"]) == [
        "GPU 0 stream 40",
        "GPU 0 stream 7",
        "thread 2910249 (pt_main_thread)",
        "thread 2919752 (pt_autograd_0)",
    ]
    assert len(ta.comm_by_row(df)) == 6  # the analysis API keeps every row
    assert "thread -549452224 (42 × `cudaEventQuery`)" in note
    assert "thread PyTorch Profiler (1 × `PyTorch Profiler (0)`)" in note
    assert kept[["comm_us", "compute_us", "cpu_op_us"]].sum(axis=1).gt(0).all()


def test_hta_overlap_prints_nothing_and_restores_its_logger(capsys, caplog):
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed (pip install -e .[dev])")
    if not DDP.is_file():
        pytest.skip(f"{DDP} is absent")
    caplog.set_level(logging.DEBUG)
    pct = checks.hta_overlap_pct(DDP)
    assert pct == pytest.approx(14.31, abs=0.01)  # HTA's overlap of the real DDP trace, steps 4 and 5
    out, err = capsys.readouterr()
    assert (out, err) == ("", "")
    assert [r for r in caplog.records if r.name.startswith("hta")] == []
    assert logging.getLogger("hta").disabled is False  # given back as it was


def test_steps_table_shows_tflops_only_for_a_gpu_run():
    def bench(device):
        steps = [
            {
                "step": i + 1,
                "warmup": i == 0,
                "step_time_ms": 700.0 + i,
                "tokens": 1700 + i,
                "tokens_per_s": 2400.0,
                "tflops": 0.002 * (i + 1),
                "tensor_bytes": 6956116,
                "rss_peak_bytes": 563 * 2**20,
            }
            for i in range(3)
        ]
        return {"device": device, "steps": steps}

    assert "tflops" not in profiling.steps_table(bench("cpu")).columns
    gpu = profiling.steps_table(bench("cuda"))
    assert gpu["tflops"].tolist() == [0.002, 0.004, 0.006]
    assert list(gpu.index) == ["1 (warm-up)", "2", "3"]


def test_run_sentence_says_why_there_is_no_mfu_once():
    _, reason = peak_tflops(None)  # what a CPU run's bench.json carries as mfu_reason
    cpu = {
        "world_size": 2,
        "device": "cpu",
        "device_name": None,
        "summary": {"timed_steps": 4, "mfu_median": None},
        "mfu_reason": reason,
        "tokens_counted": "non-padding input tokens",
    }
    sentence = profiling.run_sentence(cpu)
    assert sentence.count("not defined") == 1
    assert f"MFU: none ({reason})." in sentence
    _, unknown = peak_tflops("Some Future GPU")
    assert "MFU: none (GPU 'Some Future GPU' is not in" in profiling.run_sentence(
        {**cpu, "device": "cuda", "device_name": "Some Future GPU", "mfu_reason": unknown}
    )
    gpu = {**cpu, "device": "cuda", "summary": {"timed_steps": 4, "mfu_median": 0.4123}}
    assert "MFU: 41.2 % (" in profiling.run_sentence(gpu)


def test_kernels_by_op_on_the_real_gpu_trace(gpu):
    df, _ = gpu
    k = checks.kernels_by_op(ta.collective_kernels(df))
    ar = k[k["kind"] == "all-reduce"]
    assert set(ar["op"]) == {"nccl:all_reduce"} and ar["kernels"].tolist() == [5, 5, 5]
    assert not math.isnan(ar["gpu_us"].sum()) and ar["gpu_us"].gt(0).all()
    by_step = tables.reader_frame(k.set_index("step"), rename={"gpu_us": "GPU time"})  # repeated index
    html = tables.show(by_step).to_html()
    assert html.count("nccl:all_reduce") == 3 and "GPU time (ms)" in html and ">step<" in html


def _bench(device: str, times_ms: list[float]) -> dict:
    """A bench.json's fields that the chapter's run table reads: one warm-up step, then timed steps."""
    steps = [{"step": i + 1, "warmup": i == 0, "step_time_ms": t} for i, t in enumerate(times_ms)]
    return {"strategy": "fsdp2", "device": device, "steps": steps, "summary": {"tokens_per_step_mean": 512.0}}


def test_run_table_sets_step_times_side_by_side_only_on_a_gpu():
    cpu = {"FSDP1": _bench("cpu", [900, 100, 110, 120]), "FSDP2": _bench("cpu", [900, 150, 160, 165])}
    table = profiling.bench_table(cpu)
    assert "step_time_median_ms" not in table  # no CPU step time beside another run's
    assert table.loc["FSDP1", "spread_pct"] == pytest.approx(20.0)  # 120 / 100: the warm-up is left out
    assert table.loc["FSDP2", "spread_pct"] == pytest.approx(10.0)
    sentence = profiling.timing_sentence(cpu)
    assert "**20 %**" in sentence and "not set side by side" in sentence
    gpu = {"FSDP2": _bench("cuda", [900, 100, 104, 102])}
    assert profiling.bench_table(gpu).loc["FSDP2", "step_time_median_ms"] == pytest.approx(102.0)
    assert "side by side" not in profiling.timing_sentence(gpu)


def test_model_vs_trace_sentence_counts_the_rows_without_a_dtype():
    index = pd.MultiIndex.from_tuples(
        [("FSDP1 (fp32)", "all-gather"), ("FSDP1 (fp32)", "reduce-scatter"), ("FSDP2 (bf16)", "all-gather")],
        names=["run", "collective"],
    )
    table = pd.DataFrame(
        {"model: bytes": [10.0, 20.0, 30.0], "trace: bytes": [math.nan, 20.0, 30.0]}, index=index
    )
    sentence = model_vs_trace_sentence(table)
    assert sentence.startswith("All 3 rows agree exactly") and "on the 2 rows where" in sentence
    assert "(FSDP1 (fp32) all-gather)" in sentence
    html = tables.show(table).to_html()
    assert "nan" not in html.lower() and "—" in html


def test_placements_read_as_the_docs_write_them():
    assert tables.placement_text("(Shard(dim=0),)") == "Shard(0)"
    assert tables.placement_text("(Replicate(), Shard(dim=0))") == "(Replicate(), Shard(0))"
    assert tables.placement_text("") == ""


def test_memory_check_view_keeps_exact_bytes_and_says_where_the_estimate_is_off():
    def row(case, rank, optimizer_estimate):
        return {
            "case": case, "rank": rank, "measured_params": 1_739_008, "estimated_params": 1_739_008,
            "measured_grads": 0, "estimated_grads": 0, "measured_optimizer": 100,
            "estimated_optimizer": optimizer_estimate, "measured_static": 1_739_108,
            "estimated_static": 1_739_008 + optimizer_estimate,
            "rel_error": (optimizer_estimate - 100) / 1_739_108,
        }  # fmt: skip

    compared = pd.DataFrame([row("FSDP2 full fp32", 0, 100), row("FSDP1 LoRA bf16", 0, 100),
                             row("FSDP2 full fp32", 1, 100), row("FSDP1 LoRA bf16", 1, 104)])  # fmt: skip
    view = memory_check_view(compared)
    assert list(view.index) == [("FSDP2 full fp32", 0), ("FSDP2 full fp32", 1), ("FSDP1 LoRA bf16", 0),
                                ("FSDP1 LoRA bf16", 1)]  # fmt: skip
    assert view["estimate"].tolist() == ["exact", "exact", "exact", "+2.30e-06 of the total"]
    html = tables.show(view).to_html()
    assert "1,739,008" in html and "measured_" not in html and "nan" not in html.lower()


def test_gpu_timeline_draws_every_kernel_and_each_streams_busy_share(gpu):
    """fig-gpu-timeline: every event counted (none cut), each row's drawn area is its busy time, so a stream's
    share of the picture within each step is the busy share the chapter quotes; ranges in their own lanes,
    never over kernels; a marker for every NCCL kernel, drawn last."""
    from smolfsdp.book.figures import timeline as plotting_trace
    from smolfsdp.traces.intervals import union_length

    df, report = gpu
    fig = plotting_trace.plot_gpu_timeline(df, bins=500)
    lanes = list(fig.layout.yaxis.ticktext)
    nccl = df[df["device"].eq("gpu") & df["category"].eq("communication")]
    marks = fig.data[-1]
    assert marks.name == "each NCCL kernel" and len(marks.x) == len(nccl) == 21
    t0 = df["ts"].min()
    assert sorted(marks.x) == pytest.approx(sorted((nccl["ts"] - t0) / 1e3))
    assert {lanes[round(v + 0.08)] for v in marks.y} == {"GPU 0 stream 40"}
    width_ms = (df["end"].max() - t0) / 1e3 / 500
    for t in fig.data[:-1]:
        if t.name in plotting_trace.RANGE_CATEGORIES:
            assert all(lanes[round(v - 0.4)].endswith(" · ranges") for v in t.y), t.name
    bars = pd.concat(
        pd.DataFrame({"lane": [lanes[int(b)] for b in t.base], "x": list(t.x), "busy_ms": np.array(t.y) / 0.8 * width_ms})
        for t in fig.data[:-1]
        if t.name not in plotting_trace.RANGE_CATEGORIES
    )  # fmt: skip
    assert not bars["lane"].str.endswith(" · ranges").any()
    timed = df[~df["category"].isin(plotting_trace.RANGE_CATEGORIES)]
    for row in ("GPU 0 stream 7", "GPU 0 stream 40"):
        mine = timed[timed["row"] == row]
        drawn = bars[bars["lane"] == row]
        assert drawn["busy_ms"].sum() == pytest.approx(union_length(mine["ts"], mine["end"]) / 1e3, rel=1e-6)
        rows = report.rows.set_index(["step", "row"])
        for _, step in report.steps.iterrows():  # per step, up to the two bins cut by the step's edges
            lo, hi = (step["start_us"] - t0) / 1e3, (step["start_us"] + step["dur_us"] - t0) / 1e3
            inside = drawn.loc[drawn["x"].between(lo, hi), "busy_ms"].sum()
            want = rows.loc[(step["step"], row), "busy_us"] / 1e3
            assert abs(inside - want) <= 2 * width_ms, (row, step["step"], inside, want)
    busy7 = checks.seed_checks(report)["compute_row_busy_pct"]
    assert 10 < busy7.mean() < 30  # the compute stream's share the sentence quotes, now drawn as such
    cpu = plotting_trace.plot_timeline(df, max_events=100)  # the per-event timeline the CPU trace still uses
    assert sum(len(t.x) for t in cpu.data) == 100


def test_prefetch_sentence_explains_a_trace_without_fsdp(gpu):
    _, report = gpu
    said = profiling.prefetch_sentence(report.prefetch)
    assert "of 0 all-gather transfers, 0 pairs were in flight together" in said
    assert "no FSDP range" in said and "nothing could be prefetched" in said and "DDP" in said
    fsdp = {"fsdp": True, "transfers": 8, "concurrent_gathers": 0, "max_in_flight": 1, "annotated": 2,
            "annotated_layers": [0, 1]}  # fmt: skip
    assert profiling.prefetch_sentence(fsdp) == (
        "Prefetch: FSDP issued `backward_prefetch` for layers 0, 1; of 8 all-gather transfers, 0 pairs were in "
        "flight together (at most 1 at once)."
    )


def test_book_workflow_fetches_the_trace_the_chapters_read():
    """.github/workflows/book.yml puts HolisticTraceAnalysis's file at the path chapter 05 and the seed claims
    read, pinned to a commit, with a SHA-256 that is the bytes of the trace the project's CI has."""
    import hashlib
    import json

    import yaml
    from conftest import ROOT

    steps = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())["jobs"]["render"][
        "steps"
    ]
    fetch = next(s for s in steps if "HolisticTraceAnalysis" in s.get("name", ""))
    names = [s.get("name", s.get("uses", "")) for s in steps]
    assert names.index(fetch["name"]) < next(i for i, n in enumerate(names) if n.startswith("Render"))
    assert re.fullmatch(r"https://raw\.githubusercontent\.com/facebookresearch/HolisticTraceAnalysis/[0-9a-f]{40}",
                        fetch["env"]["HTA"])  # fmt: skip
    assert f"-o ../shared/traces/{DDP.name}" in fetch["run"] and "LICENSE" in fetch["run"]
    assert "sha256sum -c" in fetch["run"]
    read = f'"shared" / "traces" / "{DDP.name}"'  # as chapter 05 and smolfsdp.audit.seeds.claims spell it
    chapter = json.loads((ROOT / "notebooks" / "05_profiling.ipynb").read_text())
    assert any(read in "".join(c["source"]) for c in chapter["cells"])
    assert read in (ROOT / "src" / "smolfsdp" / "audit" / "seeds" / "step_claims.py").read_text()
    if DDP.is_file():
        assert hashlib.sha256(DDP.read_bytes()).hexdigest() == fetch["env"]["SHA256"]


def test_book_tables_say_yes_no_or_a_state_never_true_false_and_full_size_memory_in_gib():
    """Issue 33: the chapters' tables of the full-size model (no runs needed) hold no bare True/False cell and
    no MiB column (``tables.UNIT_RULE``: GiB for full-size models)."""
    from smolfsdp.audit.seeds import claims as sc
    from smolfsdp.book import dryrun_views, fsdp_versions
    from smolfsdp.book.figures import mechanisms as fm

    grid = dryrun_views.load_grid()
    frames = {
        "lora_state_table": fsdp_versions.lora_state_table(),
        "grid_table": dryrun_views.grid_table(grid),
        "comm_check_table": dryrun_views.comm_check_table(grid),
        "book_recipe_table": sc.book_recipe_table(),
        "plugin_args_side_by_side": sc.plugin_args_side_by_side(),
        "fsdp_config_table": sc.fsdp_config_table(),
        "no_sync_table": fm.no_sync_table("smollm3-3b", n_gpus=2, accumulation=4),
        # a full-size model's units (the chapter's full profile reads SmolLM3-3B from the Hub: offline here)
        "unit_table (3B)": fm.unit_table(
            pd.DataFrame(
                {
                    "parameters": [1_000_000_000, 80_000_000],
                    "full_bytes": [4 * 10**9, 32 * 10**7],
                    "shard_bytes_per_rank": [2 * 10**9, 16 * 10**7],
                    "held_while_computing_bytes": [2 * 10**9, 16 * 10**7],
                },
                index=["root", "model.layers.0"],
            )
        ),  # fmt: skip
    }
    for name, df in frames.items():
        cells = df.astype(str).to_numpy().ravel().tolist() + [str(c) for c in df.columns]
        assert not {"True", "False"} & set(cells), name
        assert not any(pd.api.types.is_bool_dtype(df[c]) for c in df.columns), name
        assert not any("MiB" in str(c) or "KiB" in str(c) for c in df.columns), name
    assert frames["plugin_args_side_by_side"].loc["use_orig_params"].tolist() == ["on (True)"] * 2
    assert list(frames["unit_table (3B)"].columns)[1] == "full (GiB)"
    assert tables.gib_text(0.00714) == "0.007" and tables.gib_text(31.7717) == "31.77"
