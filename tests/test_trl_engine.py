"""The TRL engine's atomic DCP checkpoints, exact resume, and benchmark mode (2 CPU ranks, FSDP1
through smolfsdp.train.accelerate_cpu_fsdp)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from smolfsdp.book import drills_view
from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.estimate import flops
from smolfsdp.launch import runner
from smolfsdp.measure import benchmark
from smolfsdp.measure.results import load_run
from smolfsdp.paths import recipe
from smolfsdp.probes import drills
from smolfsdp.traces.analysis import analyze, load_trace

KW = dict(max_steps=6, eval_steps=0, per_device_train_batch_size=2, max_length=128, too_long="truncate")
BASE = load_config(recipe("smoke_trl"), **KW)  # run whole by conftest's ``uninterrupted``


def test_kill_after_step_3_of_6_then_resume(uninterrupted, runs):
    """SIGKILL every process once step 3's checkpoint is complete; resume: same weights as uninterrupted."""
    cfg = BASE.replace(name="killed", output_dir=str(runs), save_steps=1, save_total_limit=6)
    marker = runs / "killed" / "checkpoints" / "step-000003" / checkpoint.MARKER
    proc, _ = drills.launch_and_kill(cfg, 3)  # every process of the run
    assert proc.returncode != 0 and marker.is_file(), "the run finished before it could be killed"
    latest = checkpoint.latest_checkpoint(runs / "killed")
    assert latest is not None and 3 <= int(latest.name.split("-")[1]) < 6
    assert not (runs / "killed" / "final_model").exists()
    # the Trainer's state, scheduler and RNG travel in the same atomic folder as the DCP shards
    names = {p.name for p in latest.iterdir()}
    assert {"COMPLETE", "config.yaml", "trainer_state.json", "scheduler.json", ".metadata"} <= names
    assert {"rng_state_0.pth", "rng_state_1.pth", "__0_0.distcp", "__1_0.distcp"} <= names
    step = int(latest.name.split("-")[1])
    assert json.loads((latest / "trainer_state.json").read_text())["global_step"] == step

    resumed = runner.run(cfg.replace(resume_from="latest"), capture=True, timeout=600)
    s = resumed.summary
    assert s["metrics"]["resumed_from"] == str(latest) and s["metrics"]["steps"] == 6
    assert (
        s["effective"]["strategy"] == "fsdp1"
    )  # accelerate's CPU gate lifted (smolfsdp.train.accelerate_cpu_fsdp)
    a = load_file(f"{uninterrupted.summary['final_model']}/model.safetensors")
    b = load_file(f"{s['final_model']}/model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)
    # the resumed steps logged the same losses and token counts as the uninterrupted run's; the steps
    # the killed launch logged after its last checkpoint were trained again, and Run.train keeps the last
    whole = uninterrupted.train.set_index("step")
    assert list(resumed.train["step"]) == [1, 2, 3, 4, 5, 6]
    after = resumed.train.set_index("step")
    for st in range(step + 1, 7):
        assert after.loc[st, "loss"] == pytest.approx(whole.loc[st, "loss"], rel=1e-6)
        assert after.loc[st, "tokens"] == whole.loc[st, "tokens"]
    # the summary counts this launch's tokens only, as the native engine does
    assert s["metrics"]["tokens"] == int(whole.loc[step + 1 :, "tokens"].sum())
    # the export is safetensors only: the Trainer's pickled TrainingArguments are not left beside it
    assert not list(Path(s["final_model"]).glob("*.bin"))


def test_trl_checkpoint_converts_to_the_trained_weights(runs, tmp_path):
    cfg = BASE.replace(name="saved", output_dir=str(runs), save_steps=3)
    run = runner.run(cfg, capture=True, timeout=600)
    assert sorted(p.name for p in (run.path / "checkpoints").iterdir()) == ["step-000003", "step-000006"]
    out = checkpoint.convert_checkpoint(run.path / "checkpoints" / "step-000006", tmp_path / "converted")
    converted = load_file(str(out / "model.safetensors"))
    final = load_file(str(run.path / "final_model" / "model.safetensors"))
    assert converted.keys() == final.keys()
    for k in final:
        torch.testing.assert_close(converted[k], final[k], rtol=0, atol=0)


def test_resume_with_the_other_engine_is_refused(runs):
    if not (runs / "saved" / "checkpoints").exists():
        pytest.skip("needs test_trl_checkpoint_converts_to_the_trained_weights's run")
    cfg = load_config(recipe("smoke"), name="saved", output_dir=str(runs), resume_from="latest", **KW)
    with pytest.raises(ConfigError, match="written by the trl engine, and this run uses engine: native"):
        runner.preflight(cfg)


def test_resume_refuses_other_settings_a_finished_run_and_a_missing_path(runs):
    if not (runs / "saved" / "checkpoints").exists():
        pytest.skip("needs test_trl_checkpoint_converts_to_the_trained_weights's run")
    cfg = BASE.replace(name="saved", output_dir=str(runs), save_steps=3)
    step3 = str(runs / "saved" / "checkpoints" / "step-000003")
    with pytest.raises(
        ConfigError, match=r"other settings: max_steps 6 -> 8; learning_rate 0.003 -> 0.0003\."
    ):
        runner.preflight(cfg.replace(resume_from=step3, learning_rate=3e-4, max_steps=8))
    runner.preflight(
        cfg.replace(resume_from=step3, eval_steps=2, save_total_limit=1)
    )  # may change: not trajectory
    with pytest.raises(ConfigError, match="is at step 6 and the run has max_steps=6: it is finished"):
        runner.preflight(cfg.replace(resume_from="latest"))
    with pytest.raises(ConfigError, match="step-000099 does not exist"):
        runner.preflight(cfg.replace(resume_from=str(runs / "saved" / "checkpoints" / "step-000099")))


def test_trl_benchmark_mode_and_trace(tmp_path):
    """Benchmark mode on the Trainer: same meter and formulas as the native loop; the strategy is what ran."""
    cfg = load_config(
        recipe("smoke_trl"),
        name="tb",
        output_dir=str(tmp_path),
        benchmark_steps=4,
        profile=True,
        max_length=128,
        too_long="truncate",
    )
    bench = runner.run_benchmark(cfg, timeout=600)
    run_dir = tmp_path / "tb"
    assert not (run_dir / "final_model").exists() and not (run_dir / "checkpoints").exists()
    assert bench["engine"] == "trl" and bench["strategy"] == "fsdp1" and bench["device"] == "cpu"
    steps = benchmark.steps_frame(bench)
    assert list(steps["step"]) == [1, 2, 3, 4, 5] and list(steps["warmup"]) == [True] + [False] * 4
    n, geo = bench["n_params"], {k: bench[k] for k in ("n_layers", "n_heads", "head_dim")}
    train = load_run(run_dir).train.set_index("step")
    for r in steps.itertuples():
        assert r.samples == 4 * 2 and r.tokens > 0
        assert r.tokens_per_s == pytest.approx(r.tokens / (r.step_time_ms / 1e3))
        assert r.flops_per_token == flops.flops_per_token(n, seq_len=r.seq_len, **geo)
        assert r.tflops == pytest.approx(r.flops_per_token * r.tokens_per_s / 2 / 1e12)
        # the meter's token count (attention_mask ones) is the Trainer's own non-padding count
        assert train.loc[r.step, "tokens"] == r.tokens
    assert bench["summary"]["timed_steps"] == 4 and bench["summary"]["mfu_median"] is None
    assert len(bench["traces"]) == 2
    res = analyze(load_trace(bench["traces"][0]))
    assert len(res.steps) == 3 and (res.steps["comm_us"] > 0).all()
    # the Trainer's FSDP1: at least root + 4 layers forward + 4 layers backward all-gathered per step
    # (on CPU traces FSDP1 units are labelled by order, so the Trainer's metric all-gathers add rows)
    assert res.prefetch["fsdp"] is True
    assert (res.gathers.groupby("step").size() >= 9).all()


def test_trl_elastic_restart_after_a_killed_rank(tmp_path):
    """torchrun --max-restarts 1 on the TRL engine: rank 1 SIGKILLed after step 3's checkpoint, the
    restarted Trainer resumes from it through its own resume path and ends on the uninterrupted weights."""
    from smolfsdp.probes.drills import kill_rank_drill

    cfg = load_config(
        recipe("smoke_trl"), name="el", output_dir=str(tmp_path), max_restarts=1,
        **{**KW, "per_device_train_batch_size": 4, "max_length": 256},
    )  # fmt: skip
    out = kill_rank_drill(cfg, rank=1, after_step=3)
    assert out["first_launch_exit_code"] == 0  # torchrun restarted the workers; the launch succeeded
    assert "failed (exitcode: -9) local_rank: 1" in out["launcher_said"]
    assert int(out["resumed_from"].split("-")[-1]) >= 3 and out["optimizer_steps"] == 6
    assert out["max_abs_diff"] == 0.0
    table = drills_view.drill_table([out], root=tmp_path)  # the chapter's table of it
    assert list(table.index) == ["rank 1 killed, torchrun restarts (max_restarts=1)"]
    assert table.iloc[0]["resumed from (checkpoint)"] == str(Path(out["resumed_from"]).relative_to(tmp_path))
    assert table.iloc[0]["largest weight difference from the run left alone"] == "0 (bitwise identical)"
