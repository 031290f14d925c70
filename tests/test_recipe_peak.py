"""One peak per recipe (issue 33): every page that quotes the book recipe's peak takes it from
``smolfsdp.estimate.recipe_peak`` and prints its settings beside it; equal settings give the equal number on
every page (chapters 00, 04, 07, 08 and ``smolfsdp dryrun``), and no page computes it by another path."""

import ast
import json
from pathlib import Path

import pytest

from smolfsdp.estimate.recipe_peak import (
    recipe_peak,
    recipe_settings,
    settings_from_setup,
    settings_line,
    traced_moment,
)

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def test_settings_come_from_the_recipe_and_name_what_is_counted():
    s = recipe_settings()
    assert (s["world_size"], s["strategy"], s["fsdp_version"], s["seq_len"], s["micro_batch"]) == (
        2, "FULL_SHARD", 1, 2048, 2,
    )  # fmt: skip
    assert s["gradient_accumulation_steps"] == 8 and s["activation_checkpointing"] and s["lora"] is None
    tensors, device = recipe_peak(), recipe_peak(include="device")
    # the TRL engine: TRL's fused LM head (no [tokens, vocab] logits) and the Trainer's fused AdamW (no v-sized
    # temporary): the last micro-batch's loss moment is the peak; a foreach AdamW (the native engine's) would peak
    # at its step, transformers' loss at the loss moment with the logits' fp32 tensors
    assert tensors.moment == device.moment == "loss"
    assert (tensors.settings["loss_path"], tensors.settings["adamw"]) == ("trl-fused-lm-head", "fused")
    foreach, hf = recipe_peak(adamw="foreach"), recipe_peak(loss_path="transformers")
    assert round(tensors.gib, 2) == 25.95 and round(foreach.gib, 2) == 28.64 and round(hf.gib, 2) == 31.02
    assert (foreach.moment, hf.moment) == ("optimizer", "loss")
    # foreach's sqrt(v) is as large as v: half the AdamW state, at the optimizer moment and nowhere else
    fused_m, foreach_m = tensors.estimate.moments, foreach.estimate.moments
    assert foreach_m["optimizer"] - fused_m["optimizer"] == tensors.estimate.optimizer_bytes // 2
    assert {k: v for k, v in foreach_m.items() if k != "optimizer"} == {
        k: v for k, v in fused_m.items() if k != "optimizer"
    }
    assert device.bytes - tensors.bytes == 768 * 2**20  # the CUDA context (512 MiB) + NCCL buffers (256 MiB)
    assert (
        tensors.settings_line.endswith("; tensors only")
        and "gradient accumulation 8" in tensors.settings_line
    )
    assert device.settings_line.endswith("; tensors + CUDA context and NCCL buffers")
    assert (
        "at the loss moment (backward" in device.text() and "settings: FSDP1 FULL_SHARD x 2" in device.text()
    )
    assert "TRL's fused LM-head loss (no logits), fused AdamW; tensors" in tensors.settings_line
    with pytest.raises(TypeError, match="unknown settings"):
        recipe_settings(gradient_accumulation=8)
    with pytest.raises(ValueError, match="include"):
        recipe_peak(include="reserved")


def test_the_readme_quotes_the_recipes_peak():
    """The README's sentence on the book recipe's peak: its three numbers and moment are ``recipe_peak``'s (the
    TRL engine's fused AdamW; a foreach AdamW; transformers' loss)."""
    import re

    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(r"The book recipe peaks at ([\d.]+) GiB of tensors at the (\w+) moment, not at ([\d.]+) GiB at "
                  r"AdamW's step as a foreach AdamW would have it, nor at ([\d.]+) GiB as transformers' loss", text)  # fmt: skip
    assert m, "the README no longer states the book recipe's peak in the sentence this test reads"
    peak, foreach, hf = recipe_peak(), recipe_peak(adamw="foreach"), recipe_peak(loss_path="transformers")
    assert (float(m[1]), m[2], float(m[3]), float(m[4])) == (
        round(peak.gib, 2),
        peak.moment,
        round(foreach.gib, 2),
        round(hf.gib, 2),
    )
    assert foreach.moment == "optimizer"


def test_the_recipe_as_configured_traces_the_estimated_peak():
    """The committed full-size dry run of the book recipe as configured (data/results/dryrun/recipe.json: the TRL
    engine's fused AdamW and fused LM head, 8 micro-batches of 2 x 2,048 tokens): the moment ``recipe_peak`` names
    and its bytes within 0.1 %; the static terms to the byte (what ``smolfsdp dryrun`` prints beside it)."""
    from smolfsdp.audit.dryrun.compare import compare_committed
    from smolfsdp.estimate.adamw_step import traced_adamw

    run = json.loads((ROOT / "data/results/dryrun/recipe.json").read_text())["runs"][0]
    peak = recipe_peak()
    assert traced_adamw(run["setup"]) == peak.settings["adamw"] == "fused"
    assert (
        settings_line(settings_from_setup(run["setup"])) == peak.settings_line
    )  # the same settings, in words
    assert traced_moment(run["peak_moment"]) == peak.moment == "loss"
    assert round(run["peak_bytes"] / GIB, 2) == 25.95 and run["peak_bytes"] == pytest.approx(
        peak.bytes, rel=1e-3
    )
    table = compare_committed(run, ROOT).set_index("component")
    assert (table.loc[["parameters", "gradients", "optimizer state"], "error_pct"] == 0).all()
    assert table.loc["peak (loss moment)", "estimate_gib"] * GIB == peak.bytes


def test_the_memory_command_gives_the_recipes_peak():
    """``smolfsdp memory --config`` estimates at the recipe's settings (``recipe_settings``: the engine's loss and
    AdamW step included), and options given on the command line override them."""
    import argparse

    from smolfsdp.cli_memory import add_memory_parser, memory_settings
    from smolfsdp.estimate.memory import estimate_memory

    ap = argparse.ArgumentParser()
    add_memory_parser(ap.add_subparsers(), {})
    config = str(ROOT / "configs/runs/smollm3_3b_medical.yaml")
    s = memory_settings(ap.parse_args(["memory", "--config", config]))
    assert (s["adamw"], s["loss_path"], s["gradient_accumulation_steps"]) == ("fused", "trl-fused-lm-head", 8)
    est = estimate_memory(**s)
    assert (est.moments[est.peak_moment], est.peak_moment) == (recipe_peak().bytes, recipe_peak().moment)
    native = memory_settings(
        ap.parse_args(["memory", "--config", config, "--engine", "native", "--gpus", "4"])
    )
    assert (native["adamw"], native["loss_path"], native["world_size"]) == ("foreach", "transformers", 4)
    plain = memory_settings(ap.parse_args(["memory", "--adamw", "fused"]))
    assert (plain["adamw"], plain["loss_path"], plain["world_size"], plain["lora"]) == (
        "fused",
        "transformers",
        1,
        None,
    )


def test_the_cli_estimate_path_gives_the_same_peak():
    """``smolfsdp dryrun`` puts ``dryrun.compare.estimate_for`` beside the traced peak: the same bytes."""
    from smolfsdp.audit.dryrun.compare import estimate_for
    from smolfsdp.config import load_config
    from smolfsdp.paths import recipe

    for ga in (1, 8):
        cfg = load_config(recipe("smollm3_3b_medical"), gradient_accumulation_steps=ga)
        est = estimate_for(cfg, 2)
        assert est.moments[est.peak_moment] == recipe_peak(gradient_accumulation_steps=ga).bytes


def test_every_chapter_quotes_the_same_peak_for_the_same_settings():
    from smolfsdp.audit.seeds import claims as sc
    from smolfsdp.book import dryrun_views, fsdp_versions
    from smolfsdp.book.scaling_views import book_assumptions
    from smolfsdp.estimate.scaling import scaling_table

    device = recipe_peak(include="device")
    # chapter 08 (seed claims): per GPU on 2 GPUs, the fit table's 2-GPU row
    assert sc.per_gpu_memory().values["peak_bytes"] == device.bytes
    assert sc.fit_table_rows().values["A10G, FULL_SHARD over 2"]["peak_bytes"] == device.bytes
    assert device.settings_line in sc.per_gpu_memory().evidence_text
    # chapters 03/04 (LoRA state): the FSDP1 full fine-tune row is the recipe itself
    state = fsdp_versions.lora_state_gib()
    assert state.loc[("FSDP1", "full fine-tune"), "peak per GPU (GiB)"] * GIB == pytest.approx(device.bytes)
    assert "gradient accumulation 8" in state.attrs["settings"]
    # chapter 07 (scaling): FULL_SHARD on 2 GPUs at the recipe's settings
    a = book_assumptions()
    row = scaling_table("smollm3-3b", strategies="FULL_SHARD", n_gpus=2, **a).iloc[0]
    assert row["memory_gib"] * GIB == pytest.approx(device.bytes)
    # chapter 00 (dry run): the list beside the grid quotes the recipe's two numbers and the grid row's settings
    grid = dryrun_views.load_grid()
    lines = "\n".join(dryrun_views.book_peak_lines(grid))
    assert f"**{recipe_peak().gib:,.2f} GiB**" in lines and f"**{device.gib:,.2f} GiB**" in lines
    run = next(r for r in grid["runs"] if r["label"].startswith("book: full fine-tune"))
    # the committed row was traced with transformers' loss (before the dry run took TRL's fused head) and a
    # foreach AdamW (the native engine's step): its settings line says so, and the estimate at those settings is
    # the one beside it
    traced = settings_from_setup(run["setup"])
    assert "loss_path" not in run["setup"] and (traced["loss_path"], traced["adamw"]) == (
        "transformers",
        "foreach",
    )
    assert (
        "transformers' loss (logits held), foreach AdamW; tensors only"
        in dryrun_views.traced_settings_line(run)
    )
    one = recipe_peak(
        gradient_accumulation_steps=run["setup"]["gradient_accumulation_steps"], loss_path="transformers",
        adamw="foreach", packing=False,  # the grid's rows were traced unpacked, the recipe packs since (hA)
    )  # fmt: skip
    assert settings_line(settings_from_setup(run["setup"])) == one.settings_line  # the same words for both
    assert run["peak_bytes"] == pytest.approx(one.bytes, rel=5e-3)  # traced vs estimated, same settings


def test_the_cli_prints_the_settings_line_and_the_estimators_moment():
    from types import SimpleNamespace

    import pandas as pd

    from smolfsdp.cli_dryrun import format_dryrun

    grid = json.loads((ROOT / "data/results/dryrun/grid.json").read_text())
    run = next(r for r in grid["runs"] if r["label"].startswith("book: LoRA"))  # peaks as backward starts
    report = SimpleNamespace(
        setup={**run["setup"], "engine": "native"}, label="traced on fake tensors", peak_bytes=run["peak_bytes"],
        peak_moment=run["peak_moment"], peak_by_category={"parameter": 1}, offload=None, collectives=[],
        flops_counted=1.0, flops_formula=1.0, seconds=1.0,
    )  # fmt: skip
    text = format_dryrun(report, pd.DataFrame({"component": ["peak"], "estimate_gib": [1.0]}))
    assert "at the loss moment (backward has just started; traced in FSDPPeftModelForCausalLM" in text
    assert f"(settings: {settings_line(settings_from_setup(run['setup']))}; a GPU adds" in text
    assert " during " not in text


def test_traced_moments_in_the_estimators_words():
    assert traced_moment({"phase": "optimizer", "module": "(none)"}) == "optimizer"
    assert traced_moment({"phase": "backward", "module": "FSDPSmolLM3ForCausalLM"}) == "loss"
    assert traced_moment({"phase": "backward", "module": "M.model.layers.0.mlp"}) == "last layer"
    assert traced_moment({"phase": "backward", "module": "M.model.layers.35"}) == "layer"
    from smolfsdp.book import dryrun_views

    table = dryrun_views.grid_table(dryrun_views.load_grid())
    assert (table["traced moment"] == table["estimated moment"]).all()  # every setup of the committed grid


def _calls(node) -> set[str]:
    return {
        (c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", ""))
        for c in ast.walk(node)
        if isinstance(c, ast.Call)
    }


def test_no_page_computes_the_recipes_peak_by_another_path():
    """A function in ``book/`` or ``seeds/`` that reads the recipe's settings (``book_recipe_kwargs``,
    ``recipe_settings``) calls ``recipe_peak``, never ``estimate_memory`` with them; no notebook cell reads the
    full recipe's settings into ``estimate_memory`` or types its shape (2 x 2,048 tokens) into it."""
    offenders = []
    for path in [
        *(ROOT / "src/smolfsdp/book").rglob("*.py"),
        *(ROOT / "src/smolfsdp/audit/seeds").rglob("*.py"),
    ]:
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef):
                calls = _calls(fn)
                if "estimate_memory" in calls and calls & {
                    "book_recipe_kwargs",
                    "recipe_settings",
                    "load_config",
                }:
                    offenders.append(f"{path.name}:{fn.name}")
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "estimate_memory(" not in src:
                continue
            typed = "seq_len=2048" in src.replace(" ", "") and "micro_batch=2" in src.replace(" ", "")
            if "smollm3_3b_medical" in src or "book_recipe_kwargs" in src or typed:
                offenders.append(f"{nb.name} cell {i}")
    assert not offenders, f"the recipe's peak computed outside smolfsdp.estimate.recipe_peak: {offenders}"
