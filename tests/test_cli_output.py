"""Human output by default, ``--json`` for machines (issue 17): bench, gotchas --list, convert, stop early."""

import json
import os
import stat

import pytest
import torch

from smolfsdp import cli
from smolfsdp.book.gotchas import GOTCHAS, KIND_LEGEND
from smolfsdp.checkpoint.dcp import MARKER
from smolfsdp.config import TrainConfig
from smolfsdp.launch import runner
from smolfsdp.measure import benchmark
from smolfsdp.paths import umask_modes
from smolfsdp.train import sft

CPU_BENCH = {
    "name": "bench",
    "engine": "native",
    "strategy": "fsdp1",
    "world_size": 2,
    "device": "cpu",
    "device_name": None,
    "warmup_steps": 1,
    "mfu_reason": "CPU run: smolfsdp.measure.hardware has no peak FLOP/s for CPUs, so MFU is not defined",
    "summary": {
        "timed_steps": 4,
        "step_time_ms_median": 1276.2641180001992,
        "step_time_ms_min": 808.4060059995863,
        "step_time_ms_max": 1315.1982839998709,
        "tokens_per_step_mean": 1772.25,
        "tokens_per_s_median": 2055.399603748688,
        "samples_per_s_median": 9.07,
        "tflops_median": 0.00694517464524635,
        "mfu_median": None,
    },
    "memory_per_rank": [
        {"rss_bytes": 621187072, "rss_peak_bytes": 631187072, "tensor_bytes": 6956116},
        {"rss_bytes": 618270720, "rss_peak_bytes": 628074112, "tensor_bytes": 6956120},
    ],
}


def test_bench_table_has_units_and_says_why_no_mfu():
    rows = dict(line.split("  ", 1) for line in cli.format_bench(CPU_BENCH).splitlines())
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["strategy that ran"] == "fsdp1 (native engine, 2 ranks, cpu)"
    assert rows["step time, median"] == "1276.3 ms (min 808.4, max 1315.2)"
    assert rows["tokens/s, all ranks"] == "2,055 (1,772 tokens/step)"
    assert rows["TFLOP/s per rank"] == "0.006945"
    assert (
        rows["MFU"]
        == "- (CPU run: smolfsdp.measure.hardware has no peak FLOP/s for CPUs, so MFU is not defined)"
    )
    assert rows["memory, rank 0"].startswith("601.9 MiB process RSS peak, 6.6 MiB in parameters")


def test_bench_table_gpu_memory_in_gib_and_mfu_percent():
    gpu = {
        **CPU_BENCH,
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "summary": {**CPU_BENCH["summary"], "mfu_median": 0.4123},
        "memory_per_rank": [
            {
                **CPU_BENCH["memory_per_rank"][0],
                "max_memory_allocated_bytes": 40 * 2**30,
                "max_memory_reserved_bytes": int(41.5 * 2**30),
            },
        ],
    }
    table = cli.format_bench(gpu)
    assert "MFU                  41.2 %" in table and "NVIDIA H200" in table
    assert "40.00 GiB allocated, 41.50 GiB reserved (GPU peak in the step)" in table


def test_bench_json_flag(monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_benchmark", lambda cfg: CPU_BENCH | {"traces": []})
    assert cli.main(["bench", "--json", "--output_dir", "/tmp/unused"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["step_time_ms_median"] == CPU_BENCH["summary"]["step_time_ms_median"]
    assert out["strategy"] == "fsdp1" and out["mfu_reason"].startswith("CPU run")
    assert cli.main(["bench", "--output_dir", "/tmp/unused"]) == 0
    assert "1276.3 ms" in capsys.readouterr().out


def test_rss_peak_and_rss_from_one_source():
    """bench.json had rank 0's rss_peak_bytes below its rss_bytes (psutil vs getrusage)."""
    keep = torch.ones(32 * 2**20 // 4)  # 32 MiB touched: RSS moves between reads
    for _ in range(50):
        m = benchmark.process_rss()
        assert m["rss_peak_bytes"] >= m["rss_bytes"] > 32 * 2**20
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    assert abs(m["rss_bytes"] - int(status["VmRSS"].split()[0]) * 1024) < 64 * 2**20
    del keep


def test_step_meter_memory_uses_one_source(monkeypatch):
    monkeypatch.setattr(benchmark, "process_rss", lambda: {"rss_bytes": 10, "rss_peak_bytes": 12})
    meter = benchmark.StepMeter.__new__(benchmark.StepMeter)
    meter.info = type("I", (), {"device": torch.device("cpu")})()
    meter._tensor_bytes = 7
    assert meter.memory() == {"rss_bytes": 10, "rss_peak_bytes": 12, "tensor_bytes": 7}


def test_gotchas_list_explains_its_columns_and_json(capsys):
    assert cli.main(["gotchas", "--list"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["name", "how", "title"]
    for kind, meaning in KIND_LEGEND.items():
        assert f"  {kind:<6} {meaning}" in text
    assert cli.main(["gotchas", "--list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(GOTCHAS)
    assert all(r["how_means"] == KIND_LEGEND[r["how"]] for r in rows)


def _checkpoint(tmp_path, **fields):
    run = tmp_path / "runs" / "r"
    ckpt = run / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    (ckpt / MARKER).write_text("")
    TrainConfig(name="r", output_dir=str(tmp_path / "runs"), **fields).save(run / "config.yaml")
    return run, ckpt


def test_convert_says_it_merges_a_lora_adapter(tmp_path):
    run, ckpt = _checkpoint(tmp_path, lora=True, lora_r=8, lora_alpha=16)
    plan = cli.convert_plan(str(ckpt))
    assert "is a LoRA run (r=8, alpha=16, q_proj,k_proj,v_proj,o_proj)" in plan
    assert "merging the adapter into the base model tiny" in plan
    run2, ckpt2 = _checkpoint(tmp_path / "full")
    assert cli.convert_plan(str(ckpt2)) == f"[smolfsdp] converting {ckpt2} (model tiny) to model.safetensors"


def test_stop_note_says_where_it_can_resume(tmp_path):
    run, ckpt = _checkpoint(tmp_path)
    summary = {"metrics": {"stopped_early": True, "steps": 3}}
    note = sft.stop_note(summary, run)
    assert note.startswith(
        f"stopped early at step 3 (stop_at_step): no final evaluation, no final model; it can resume from {ckpt}:"
    )
    assert sft.stop_note({"metrics": {"stopped_early": False, "steps": 3}}, run) is None
    empty = tmp_path / "runs" / "none"
    assert "no checkpoint was saved (save_steps 0)" in sft.stop_note(summary, empty)


def test_resume_command_is_the_same_command_without_the_stop():
    cmd = cli.resume_command(
        "configs/runs/smoke.yaml",
        ["--save_steps", "2", "--stop_at_step", "3", "--output-dir=/tmp/a b", "--lora"],
    )
    assert (
        cmd
        == "smolfsdp train --config configs/runs/smoke.yaml --save_steps 2 '--output-dir=/tmp/a b' --lora --resume"
    )
    assert cli.resume_command(None, ["--stop-at-step=3", "--resume"]) == "smolfsdp train --resume"


def test_umask_modes_undoes_safetensors_0600(tmp_path):
    from safetensors.torch import save_file

    old = os.umask(0o022)
    try:
        save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
        (tmp_path / "config.json").write_text("{}")
        assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == 0o600  # the cause
        umask_modes(tmp_path)
        assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o644}
    finally:
        os.umask(old)


@pytest.mark.parametrize("steps", [0])
def test_bench_table_without_timed_steps(steps):
    assert "no timed steps" in cli.format_bench({**CPU_BENCH, "summary": {"timed_steps": steps}})
