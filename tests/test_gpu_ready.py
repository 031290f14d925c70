"""Ready for a GPU box (issue 24): the 3B recipes checkpoint and the disk check counts it; the wait for
rank 0's export is sized to its bytes; the full profile's time budget follows its formula, the chapters
use its sizes and the README states its total."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT

from smolfsdp.book import chapters, full_budget
from smolfsdp.checkpoint.disk import estimate_checkpoint_bytes
from smolfsdp.config import load_config
from smolfsdp.estimate import flops
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.estimate.time_model import plan_time
from smolfsdp.launch import runner
from smolfsdp.paths import recipe
from smolfsdp.sharding import distributed
from smolfsdp.sharding.lora import apply_lora


def _meta_3b(cfg):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(resolve_model_config("smollm3-3b"))
    return apply_lora(model, cfg) if cfg.lora else model


@pytest.mark.parametrize("name", ["smollm3_3b_medical", "lora_smollm3_3b"])
def test_3b_recipes_checkpoint_and_the_disk_check_counts_it(name):
    cfg = load_config(recipe(name))
    assert cfg.save_steps > 0 and cfg.save_total_limit >= 1
    steps = full_budget.optimizer_steps(cfg)
    assert steps // cfg.save_steps >= 2  # more than one save in the epoch: a late failure loses little
    meta = _meta_3b(cfg)
    one = estimate_checkpoint_bytes(meta)
    final = runner.bytes_to_write(cfg.replace(save_steps=0), meta)
    # K + 1 checkpoints on disk at once (the new one completes before the oldest goes), and the final model
    assert runner.bytes_to_write(cfg, meta) == (cfg.save_total_limit + 1) * one + final
    # the budget's checkpoint bytes are the same estimate, from the parameter counts
    assert full_budget.run_budget(cfg, "H100 SXM", 2)["checkpoint bytes"] == pytest.approx(one, rel=1e-6)
    if not cfg.lora:
        assert 38e9 < one < 41e9  # 3.1 B fp32 weights (tied embedding twice) + AdamW m, v, + 5 %


def test_wait_for_rank0_export_is_sized_to_its_bytes():
    assert distributed.write_wait_timeout_s(0) == distributed.WRITE_WAIT_SLACK_S == 600
    # SmolLM3-3B's fp32 export, 12.3 GB, written at 50 MB/s: 246 s on top of the 600
    assert distributed.write_wait_timeout_s(12.3e9) == pytest.approx(846)


def test_training_time_follows_the_flops_formula():
    # 1e9 tokens x 2e10 FLOPs on 2 GPUs of 1000 TFLOP/s at 40 %: 2e19 / 8e14 = 25,000 s
    assert flops.training_time_s(1e9, 2e10, 1000, 2, 0.4) == pytest.approx(25_000)
    with pytest.raises(ValueError, match="mfu in"):
        flops.training_time_s(1e9, 2e10, 1000, 2, 1.5)


@pytest.fixture(scope="module")
def budgets():
    return {gpu: full_budget.full_profile_budget(gpu) for gpu in full_budget.BUDGET_GPUS}


def test_full_profile_budget_rows(budgets):
    h100 = budgets["H100 SXM"].set_index("run")
    real = h100.loc["the real run: 1 epoch (TRL, FSDP1)"]
    cfg = load_config(recipe("smollm3_3b_medical"))
    rows = cfg.max_rows - cfg.eval_size  # 19,800 training rows, 32 per optimizer step
    # the one time model: the steps and step time `smolfsdp memory --config` prints, at the calibrated MFU
    plan = plan_time(
        cfg, "H100 SXM", 2
    )  # the recipe packs: fewer steps than a step per 32 of its 19,800 rows
    steps = plan.steps_per_epoch
    assert real["optimizer steps"] == steps < -(-rows // 32) == 619
    assert real["tokens (upper bound)"] == steps * 32 * 2048
    assert real["train s"] == pytest.approx(steps * plan.step_s) and real["MFU"] == plan.mfu
    assert real["train s"] == pytest.approx(plan.epoch_s)
    # evaluation: forward only (a third of the FLOPs per token) at the same MFU
    evals = steps // cfg.eval_steps + 1
    expected = flops.training_time_s(
        evals * cfg.eval_size * 2048, real["model FLOPs per token"] / 3, 989, 2, plan.mfu
    )
    assert real["eval s"] == pytest.approx(expected)
    assert real["checkpoints"] == steps // cfg.save_steps == 3
    lora, twin = h100.loc["LoRA (FSDP2)"], h100.loc["full fine-tune twin (FSDP2)"]
    assert lora["optimizer steps"] == twin["optimizer steps"] == full_budget.CH04_FULL_MAX_STEPS
    assert lora["model FLOPs per token"] < twin["model FLOPs per token"]  # frozen weights: no weight gradient
    assert lora["step s"] < twin["step s"]
    # every row is its run's plan on that GPU: steps x plan_time's step time
    for gpu, df in budgets.items():
        for run, (_, row) in zip(full_budget.full_profile_runs(), df.iterrows(), strict=True):
            assert row["step s"] == pytest.approx(plan_time(run["cfg"], gpu, 2).step_s), run["run"]
            assert row["train s"] == pytest.approx(row["optimizer steps"] * row["step s"])


def test_full_branches_use_the_budgets_sizes_and_no_cell_cut():
    assert chapters.CELL_TIMEOUT_S == {"smoke": 900, "full": None}
    sources = {
        nb: "".join(
            "".join(c["source"])
            for c in json.loads((ROOT / "notebooks" / f"{nb}.ipynb").read_text())["cells"]
        )
        for nb in ("04_lora_fsdp2", "05_profiling")
    }
    assert "CH04_FULL_MAX_STEPS" in sources["04_lora_fsdp2"] and "CH05_FULL" in sources["05_profiling"]
    assert full_budget.CH05_FULL["profile_active"] == 1 and full_budget.CH05_FULL["record_shapes"] is False


def test_readme_states_the_budget(budgets):
    readme = (ROOT / "README.md").read_text()
    for gpu, df in budgets.items():
        hours = round(float(df["total s"].sum()) / 3600, 1)
        assert f"2 x {gpu}: about {hours} h" in readme
        assert hours < 3  # each full branch fits: the whole training work of the book in under 3 hours
    # each profiled benchmark fits chapter 05's per-run timeout on the slower GPU
    bench = budgets["A100 80GB"]
    assert bench.loc[bench["chapter"].eq("05_profiling"), "total s"].max() < 3600
