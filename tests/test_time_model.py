"""The one time model (issue 42): `smolfsdp memory --config` prints the step time, tokens/s per GPU, MFU with its
source and epoch hours that chapters 01 and 07 and the full-profile budget show, from one function; the memory
command builds no model and loads no modeling code."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import ROOT

from smolfsdp.book import scaling_views, two_gpu_run
from smolfsdp.cli import main
from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.estimate.calibration import run_mfu
from smolfsdp.estimate.scaling import estimate_step
from smolfsdp.estimate.seed_lengths import packed_fill, seed_like_lengths
from smolfsdp.estimate.time_model import data_tokens, duration, epoch_rows, plan_time
from smolfsdp.estimate.token_share import padded_share
from smolfsdp.paths import recipe

BOOK = "configs/runs/smollm3_3b_medical.yaml"


def _memory(capsys, *args) -> str:
    assert main(["memory", "--config", BOOK, *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("gpu", ["H100 SXM", "A100 80GB"])
def test_cli_prints_what_the_chapters_show(capsys, gpu):
    out = _memory(capsys, "--gpu", gpu)
    plan = plan_time(load_config(recipe("smollm3_3b_medical")), gpu)
    lines = out[out.index("\nverdict on") :].splitlines()  # after the memory verdict
    step = next(line for line in lines if line.startswith("step time (estimated): "))
    epoch = next(line for line in lines if line.startswith("epoch (estimated): "))
    assert step.startswith(f"step time (estimated): {duration(plan.step_s)} per optimizer step on 2 x {gpu}")
    assert epoch.startswith(
        f"epoch (estimated): {duration(plan.epoch_s)}, {plan.steps_per_epoch:,} optimizer steps"
    )
    assert f"MFU: {plan.mfu_source}" in lines
    # chapter 07's table: the same step and epoch for each card
    row = scaling_views.recipe_time_view(gpus=(gpu,)).iloc[0]
    assert row["step (s)"] == f"{plan.step_s:.2f}" and row["epoch"] == duration(plan.epoch_s)
    if gpu == "H100 SXM":  # chapter 01's card (book_assumptions): its sentence states the same two numbers
        t = two_gpu_run.expected_time()
        assert t["plan"] == plan and t["epoch_s"] == plan.epoch_s
        text = two_gpu_run.expectations_markdown()
        assert f"**{duration(plan.step_s)}**" in text and f"**{duration(plan.epoch_s)}**" in text
        assert duration(plan.step_s) in step and duration(plan.epoch_s) in epoch


def test_cli_json_carries_the_plan(capsys):
    out = json.loads(_memory(capsys, "--gpu", "H100 SXM", "--json"))["time"]
    plan = plan_time(load_config(recipe("smollm3_3b_medical")), "H100 SXM")
    assert out["step_s"] == pytest.approx(plan.step_s) and out["epoch_h"] == pytest.approx(
        plan.epoch_s / 3600
    )
    data = data_tokens(load_config(recipe("smollm3_3b_medical")))  # the recipe packs the seed's rows
    packed = math.ceil(19_800 * data.mean_row_tokens / (data.share * 32_768 * 2))
    assert (
        out["steps_per_epoch"] == packed == 337 and out["epoch_rows"] == 19_800 and out["rows_per_step"] == 32
    )
    assert out["mfu"] == plan.mfu and out["mfu_source"] == plan.mfu_source
    assert out["tokens_per_s_per_gpu"] == pytest.approx(data.share * 32_768 / plan.step_s)


def test_options_given_over_the_recipe_reach_the_time(capsys):
    out = json.loads(_memory(capsys, "--gpu", "H100 SXM", "--gpus", "4", "--micro-batch", "4", "--json"))[
        "time"
    ]
    cfg = load_config(recipe("smollm3_3b_medical"), nproc=4, per_device_train_batch_size=4)
    assert out["n_gpus"] == 4 and out["rows_per_step"] == 4 * 4 * 8
    assert out["step_s"] == pytest.approx(plan_time(cfg, "H100 SXM").step_s)
    data = data_tokens(cfg)
    assert out["steps_per_epoch"] == math.ceil(
        19_800 * data.mean_row_tokens / (data.share * 4 * 2048 * 8 * 4)
    )


def test_without_a_recipe_or_a_peak_the_time_says_why(capsys):
    assert main(["memory", "--gpu", "H100 SXM"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("time: not estimated (give --config, a run recipe, for step "
                                                     "time, tokens/s, MFU and epoch hours)")  # fmt: skip
    out = json.loads(_memory(capsys, "--gpu-memory-gib", "40", "--json"))["time"]
    assert out["not_estimated"].startswith("custom 40 GiB has no bf16 peak TFLOP/s; give --gpu with one of")


def test_plan_is_estimate_step_at_the_calibrated_mfu():
    cfg = load_config(recipe("smollm3_3b_medical"))
    plan = plan_time(cfg, "H100 SXM", token_share=1.0)  # every row a whole max_length slot
    mfu = run_mfu("H100 SXM", "smollm3-3b", seq_len=2048, ac_mode="full")
    assert (plan.mfu, plan.mfu_source) == (mfu["mfu"], mfu["text"]) and "H100 SXM" in plan.mfu_source
    assert "activation checkpointing full" in plan.mfu_source  # the recompute taken off the HFU, stated
    step = estimate_step("smollm3-3b", n_gpus=2, seq_len=2048, micro_batch=2, gradient_accumulation_steps=8,
                         mfu=mfu["mfu"], fsdp_version=1)  # fmt: skip
    assert plan.step_s == pytest.approx(step["step_s"]) and plan.computed_tokens_per_step == 2 * 2048 * 8
    assert plan.epoch_s == pytest.approx(619 * plan.step_s) and plan.run_steps == 619
    # without checkpointing: nothing recomputed, MFU = the HFU, a shorter step
    off = plan_time(cfg.replace(activation_checkpointing=False), "H100 SXM", token_share=1.0)
    assert off.mfu == run_mfu("H100 SXM", "smollm3-3b", seq_len=2048, ac_mode=None)["mfu"] > plan.mfu
    assert off.step_s < plan.step_s


def test_token_share_and_packing_set_tokens_and_steps():
    cfg = load_config(recipe("smollm3_3b_medical"))
    full = plan_time(cfg, "H100 SXM", token_share=1.0)
    padded = plan_time(cfg, "H100 SXM", token_share=0.8)  # one row per slot, 80 % of it real
    assert padded.step_s == full.step_s and padded.steps_per_epoch == full.steps_per_epoch == 619
    assert padded.tokens_per_s_per_gpu == pytest.approx(0.8 * full.tokens_per_s_per_gpu)
    # packed: 19,800 rows of 600 real tokens fill slots 98 % real: ceil(19,800 x 600 / (0.98 x 32,768 x 2)) = 185
    packed = plan_time(cfg, "H100 SXM", token_share=0.98, mean_row_tokens=600)
    assert packed.steps_per_epoch == math.ceil(19_800 * 600 / (0.98 * 32_768 * 2)) == 185
    assert packed.epoch_s == pytest.approx(185 * full.step_s)
    with pytest.raises(
        ConfigError, match=r"token_share=1.5: give real / computed tokens as a fraction in \(0, 1\]"
    ):
        plan_time(cfg, token_share=1.5)


def test_epoch_rows_and_their_source():
    smoke = load_config(recipe("smoke"))  # the bundled sample: 180 rows, 10 % held out
    assert epoch_rows(smoke) == (162, "180 rows in data/medical_qa/medical_qa_sample.jsonl, less 18 held out "
                                      "for evaluation")  # fmt: skip
    assert epoch_rows(smoke.replace(max_rows=100))[0] == 90
    book = load_config(recipe("smollm3_3b_medical"))
    rows, source = epoch_rows(book)
    assert rows == 19_800 and source.startswith(
        "the recipe's max_rows 20,000 (FreedomIntelligence/medical-o1-"
    )
    assert "not read offline: at most that many" in source
    rows, why = epoch_rows(book.replace(max_rows=None))
    assert rows is None and "give max_rows" in why
    assert plan_time(book.replace(max_rows=None)).epoch_s is None


def test_memory_command_builds_no_model_and_loads_no_modeling_code():
    code = (
        "import sys, io, contextlib\n"
        "from smolfsdp.estimate import params\n"
        "params._meta_units = lambda *a: (_ for _ in ()).throw(AssertionError('a model was built'))\n"
        "from smolfsdp.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()): main(['memory', '--config', {BOOK!r}])\n"
        "heavy = ('transformers.modeling_utils', 'transformers.models.smollm3.modeling_smollm3', 'peft', 'trl', "
        "'accelerate', 'transformers.training_args')\n"
        "print(' '.join(m for m in heavy if m in sys.modules) or 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "none"


def test_the_seeds_rows_set_the_share_the_step_and_the_epoch():
    """For the seed's data set the plan batches the seed-like rows as the run does: packed rows fill TRL's BFD
    share of each max_length slot; unpacked, each slot is the mean row padded to its micro-batch's longest."""
    cfg = load_config(recipe("smollm3_3b_medical"))
    lengths = seed_like_lengths(2048)
    mean = sum(lengths) / len(lengths)
    packed = plan_time(cfg, "H100 SXM")
    assert packed.token_share == packed_fill(2048) and "TRL's BFD" in packed.token_text
    assert packed.computed_tokens_per_step == 2 * 2048 * 8
    assert packed.steps_per_epoch == math.ceil(19_800 * mean / (packed_fill(2048) * 32_768 * 2))
    unpacked = plan_time(cfg.replace(packing=False), "H100 SXM")
    share = padded_share(lengths, 2, cfg.seed)
    assert unpacked.token_share == share and unpacked.steps_per_epoch == 619  # a row per slot, 32 per step
    assert unpacked.computed_tokens_per_step == 2 * round(mean / share) * 8
    assert unpacked.step_s < packed.step_s  # padded rows are shorter than a packed 2,048-token row
    other = plan_time(cfg.replace(dataset="bundled", packing=False), "H100 SXM")
    assert other.token_share == 1.0 and "every row fills max_length" in other.token_text


def test_an_option_typed_at_its_default_still_overrides_the_recipe(capsys):
    """`--micro-batch 1` is the parser's default; typed over a recipe of micro-batch 2 it must still count."""
    out = json.loads(_memory(capsys, "--gpu", "H100 SXM", "--micro-batch", "1", "--gpus", "1", "--json"))
    cfg = load_config(recipe("smollm3_3b_medical"), per_device_train_batch_size=1, nproc=1)
    assert out["estimate"]["micro_batch"] == 1 and out["estimate"]["world_size"] == 1
    assert out["time"]["rows_per_step"] == 1 * 1 * 8 and out["time"]["n_gpus"] == 1
    assert out["time"]["step_s"] == pytest.approx(plan_time(cfg, "H100 SXM").step_s)
