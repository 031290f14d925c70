"""smolfsdp.measure.benchmark: the FLOPs formula on a known model, MFU, the GPU table, config checks, and
one 2-rank benchmark run whose bench.json must be self-consistent."""

from __future__ import annotations

import math

import pytest

from smolfsdp.book import profiling
from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.estimate import flops
from smolfsdp.launch import runner
from smolfsdp.measure import benchmark
from smolfsdp.paths import recipe


def test_flops_per_token_palm_formula_on_smollm3_3b_geometry():
    """SmolLM3-3B: 36 layers, 16 heads of 128 (hidden 2048); 6N + 12·L·H·Q·T at T = 4096."""
    n = 3_075_098_624
    fpt = flops.flops_per_token(n, 36, 16, 128, 4096)
    assert fpt == 6 * n + 12 * 36 * 16 * 128 * 4096
    # LoRA: frozen weights get no weight gradient: 4 FLOPs per frozen parameter, 6 per trainable one
    lora = flops.flops_per_token(n, 36, 16, 128, 4096, trainable_params=1_000)
    assert lora == 4 * n + 2 * 1_000 + 12 * 36 * 16 * 128 * 4096


def test_tiny_model_geometry_and_tied_embedding_counted_once(tokenizer):
    from smolfsdp.models.modeling import build_model, count_parameters

    model = build_model("tiny", tokenizer, seed=0)
    geo = benchmark.model_geometry(model)
    c = model.config
    q = c.hidden_size // c.num_attention_heads  # SmolLM3Config has no head_dim field
    assert geo == {"n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads, "head_dim": q}
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert benchmark.matmul_params(model) == count_parameters(model)


def test_step_metrics_are_consistent():
    """tokens/s = tokens per step / step time; TFLOP/s per rank; MFU = TFLOP/s / peak."""
    fpt = flops.flops_per_token(1_000_000, 4, 4, 16, 128)
    m = benchmark.step_metrics(250.0, 2_000, 16, fpt, world_size=2, peak=989.0)
    assert m["tokens_per_s"] == pytest.approx(2_000 / 0.25)
    assert m["samples_per_s"] == pytest.approx(16 / 0.25)
    assert m["tflops"] == pytest.approx(fpt * 2_000 / 0.25 / 2 / 1e12)
    assert m["mfu"] == pytest.approx(m["tflops"] / 989.0)
    assert benchmark.step_metrics(250.0, 2_000, 16, fpt, 2, None)["mfu"] is None
    with pytest.raises(ValueError):
        benchmark.step_metrics(0.0, 1, 1, fpt, 1, None)


@pytest.mark.parametrize(
    ("device_name", "tflops"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
    ],
)
def test_peak_tflops_from_hardware_table(device_name, tflops):
    assert benchmark.peak_tflops(device_name)[0] == tflops


@pytest.mark.parametrize("device_name", ["NVIDIA GeForce RTX 4090", "NVIDIA H100 PCIe", None])
def test_unknown_gpu_or_cpu_leaves_mfu_empty_with_reason(device_name):
    peak, reason = benchmark.peak_tflops(device_name)
    assert peak is None
    assert ("not in smolfsdp.estimate.hardware" in reason) if device_name else ("CPU" in reason)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"benchmark_steps": -1}, "benchmark_steps=-1"),
        ({"profile_active": 0}, "profile_active=0"),
        ({"profile_wait": -2}, "profile_wait=-2"),
        ({"benchmark_warmup_steps": -1}, "benchmark_warmup_steps"),
        ({"benchmark_steps": 2, "profile": True}, "profile needs 5 steps"),
        ({"benchmark_steps": 3, "save_steps": 2}, "no checkpoints"),
    ],
)
def test_bad_benchmark_configs(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(recipe("smoke"), **overrides)


def test_benchmark_mode_sets_steps_and_saves_nothing():
    cfg = load_config(recipe("smoke"), benchmark_steps=4, benchmark_warmup_steps=2)
    assert cfg.max_steps == 6 and cfg.save_final_model is False


def test_benchmark_run_bench_json_is_consistent(tmp_path):
    """2 CPU ranks, FSDP2, 1 warm-up + 3 timed steps: every row obeys the formulas; MFU is empty on CPU."""
    cfg = load_config(recipe("smoke"), name="b", output_dir=str(tmp_path), fsdp_version=2, benchmark_steps=3)
    bench = runner.run_benchmark(cfg, timeout=300)
    run_dir = tmp_path / "b"
    assert not (run_dir / "final_model").exists() and not (run_dir / "checkpoints").exists()
    assert bench["traces"] == [] and bench["device"] == "cpu"
    assert (bench["strategy"], bench["sharding_strategy"], bench["mesh_shape"]) == (
        "fsdp2",
        "FULL_SHARD",
        [2],
    )
    assert bench["mfu_reason"].startswith("CPU run")
    steps = benchmark.steps_frame(bench)
    assert list(steps["step"]) == [1, 2, 3, 4] and list(steps["warmup"]) == [True, False, False, False]
    n, geo = bench["n_params"], {k: bench[k] for k in ("n_layers", "n_heads", "head_dim")}
    for r in steps.itertuples():
        assert r.tokens > 0 and r.samples == 4 * 2
        assert r.tokens_per_s == pytest.approx(r.tokens / (r.step_time_ms / 1e3))
        assert r.flops_per_token == flops.flops_per_token(n, seq_len=r.seq_len, **geo)
        assert r.tflops == pytest.approx(r.flops_per_token * r.tokens_per_s / 2 / 1e12)
        assert r.mfu is None or (isinstance(r.mfu, float) and math.isnan(r.mfu))
        assert r.tensor_bytes > 0 and r.rss_peak_bytes >= r.rss_bytes  # a peak is never below "now"
    s = bench["summary"]
    assert s["timed_steps"] == 3 and s["mfu_median"] is None
    assert s["step_time_ms_median"] == pytest.approx(steps[~steps["warmup"]]["step_time_ms"].median())
    assert len(bench["memory_per_rank"]) == 2
    for rank, m in enumerate(bench["memory_per_rank"]):  # rank 0 once had its peak below its RSS
        assert m["rss_peak_bytes"] >= m["rss_bytes"] > 2**20, (rank, m)
    # the chapter's table of this run: the spread is the slowest over the fastest timed step
    table = profiling.bench_table({"FSDP2": bench}).loc["FSDP2"]
    timed = steps[~steps["warmup"]]["step_time_ms"]
    assert table["timed_steps"] == 3 and table["strategy"] == "FSDP2"
    assert table["spread_pct"] == pytest.approx(100 * (timed.max() / timed.min() - 1))
    assert "step_time_median_ms" not in table  # a CPU run's step time is never set beside another run's
    assert "not set side by side" in profiling.timing_sentence({"FSDP2": bench})
    # the chapter's per-step table: no TFLOP/s on a CPU run; the sentence says "not defined" once
    assert "tflops" not in profiling.steps_table(bench).columns
    assert profiling.steps_table({**bench, "device": "cuda"})["tflops"].tolist() == steps["tflops"].tolist()
    assert profiling.run_sentence(bench).count("not defined") == 1
    # the same rows went to metrics.jsonl
    from smolfsdp.measure.results import load_run

    train = load_run(run_dir).train
    assert list(train["tokens_per_s"].round(6)) == list(steps["tokens_per_s"].round(6))
