"""Activation checkpointing chosen by card (issue 42): ``smolfsdp memory --config <recipe> --gpu <card>`` names the
least checkpointing whose reserved estimate fits, and its estimated tokens/s against full checkpointing.

The numbers are the package's own estimates for the shipped 3B recipe (SmolLM3-3B, 2 GPUs, FSDP1 FULL_SHARD,
micro-batch 2 x 2,048 tokens, TRL engine): 55.1 GiB reserved without checkpointing (the issue's figure), 35.8 GiB
with full checkpointing, and +22 % tokens/s from ``estimate_step`` on an H100 SXM.
"""

import json

import pytest

from smolfsdp import cli
from smolfsdp.config import load_config
from smolfsdp.estimate.ac_choice import OPTIONS, choose_checkpointing
from smolfsdp.estimate.adamw_step import engine_optimizer
from smolfsdp.estimate.hardware import get_gpu
from smolfsdp.estimate.loss_path import engine_loss_path
from smolfsdp.estimate.recipe_peak import recipe_settings
from smolfsdp.estimate.scaling import estimate_step
from smolfsdp.paths import recipe

RECIPE = recipe("smollm3_3b_medical")


def _settings(engine: str) -> dict:
    """The 3B recipe's estimate settings, with the engine's loss path and AdamW step (as ``smolfsdp memory``)."""
    s = recipe_settings(load_config(RECIPE))
    return {**s, "loss_path": engine_loss_path(engine), "adamw": engine_optimizer(engine)}


@pytest.mark.parametrize(("card", "gain"), [("H100 SXM", 0.224), ("A100 80GB", 0.226)])
def test_80gb_cards_train_the_3b_recipe_without_checkpointing(card, gain):
    c = choose_checkpointing(_settings("trl"), get_gpu(card), "trl")
    assert c.asked == "full" and c.choice == "off"
    off = c.verdicts["off"]
    assert (
        off.fits
        and off.need_gib == pytest.approx(55.1, abs=0.05)
        and off.gpu_gib == pytest.approx(74.5, abs=0.05)
    )
    assert c.gain == pytest.approx(gain, abs=0.001)
    # the gain is estimate_step's own numbers, checkpointing off against full
    kw = dict(
        strategy="FULL_SHARD", n_gpus=2, gpu=card, seq_len=2048, micro_batch=2, gradient_accumulation_steps=8
    )
    steps = {ac: estimate_step("HuggingFaceTB/SmolLM3-3B", fsdp_version=1, activation_checkpointing=ac, **kw)
             for ac in (False, True)}  # fmt: skip
    assert c.tokens_per_s["off"] == pytest.approx(steps[False]["tokens_per_s_per_gpu"])
    assert c.tokens_per_s["full"] == pytest.approx(steps[True]["tokens_per_s_per_gpu"])
    assert "train with --activation_checkpointing false" in c.text and f"{gain:+.0%}" in c.text
    assert c.skipped == ("op", "layer")  # the Trainer applies full checkpointing only


def test_a100_40gb_keeps_full_checkpointing():
    c = choose_checkpointing(_settings("trl"), get_gpu("A100 40GB"), "trl")
    assert c.choice == "full" and c.verdicts["off"].word == "does not fit"
    assert c.verdicts["full"].need_gib == pytest.approx(35.8, abs=0.05) and c.verdicts["full"].fits
    assert "the settings ask" not in c.text  # the recipe already asks for it


@pytest.mark.parametrize(
    ("gib", "choice", "tried"),
    [
        (62, "off", ["off"]),  # the native engine holds transformers' logits: 60.7 GiB without checkpointing
        (50, "op", ["off", "op"]),  # op-level selective: 46.8 GiB
        (
            45,
            "full",
            ["off", "op", "layer", "full"],
        ),  # op 46.8 and every 2nd layer 51.1 do not fit: full, 41.4
    ],
)
def test_native_engine_takes_selective_checkpointing_where_it_fits(gib, choice, tried):
    c = choose_checkpointing(_settings("native"), get_gpu(memory_gib=gib), "native")
    assert c.choice == choice and list(c.verdicts) == tried
    assert {k: round(v.need_gib, 1) for k, v in c.verdicts.items()} == {
        k: v for k, v in {"off": 60.7, "op": 46.8, "layer": 51.1, "full": 41.4}.items() if k in tried}  # fmt: skip
    assert (
        c.tokens_per_s == {}
    )  # a card given by memory alone has no bf16 peak: no step time, no gain claimed
    assert OPTIONS[choice] in c.text or choice == "full"


def test_memory_command_prints_and_returns_the_choice(capsys):
    args = ["memory", "--config", str(RECIPE), "--gpu", "A100 80GB"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "activation checkpointing on A100 80GB (trl engine): off: fits: needs 55.1 GiB reserved" in out
    assert "+23% over full checkpointing" in out
    assert cli.main([*args, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["checkpointing"]
    assert said["choice"] == "off" and said["options"] == "--activation_checkpointing false"
    assert said["gain_over_full"] == pytest.approx(0.2264, abs=1e-4)
