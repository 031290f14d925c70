"""Chapter 01's "Running it on two GPUs": its numbers are the functions every page uses, for the book's recipe."""

import math

import pytest

from smolfsdp.book import two_gpu_run
from smolfsdp.book.scaling_views import book_assumptions
from smolfsdp.estimate.hardware import fit_verdict, get_gpu, verdict
from smolfsdp.estimate.recipe_peak import recipe_peak
from smolfsdp.estimate.time_model import duration


@pytest.fixture(scope="module")
def text():
    return two_gpu_run.expectations_markdown()


def test_memory_is_recipe_peak_and_verdict_on_the_assumed_card(text):
    m = two_gpu_run.expected_memory()
    tensors, device = recipe_peak(), recipe_peak(include="device")
    assert m["tensors"].bytes == tensors.bytes and m["device"].bytes == device.bytes
    card = get_gpu(book_assumptions()["gpu"])
    assert m["gpu"] == card and m["verdict"] == verdict(tensors.estimate, card)
    assert m["need_gib"] == tensors.estimate.device_need_bytes / 2**30
    assert tensors.bytes < device.bytes <= tensors.estimate.device_need_bytes  # each adds to the last
    for number in (tensors.gib, device.gib, m["need_gib"]):
        assert f"{number:.1f} GiB" in text
    # the one verdict line every page and `smolfsdp memory` print: word, need and tensor peak
    assert m["fit"] == fit_verdict(tensors.estimate, card)
    assert f"**{m['fit'].line}**" in text and tensors.settings_line in text


def test_time_is_estimate_step_over_the_recipes_epoch(text):
    t = two_gpu_run.expected_time()
    cfg = t["cfg"]
    # 20,000 rows less 200 held out for evaluation, 2 GPUs x 2 rows x 8 micro-batches per optimizer step
    assert (cfg.max_rows, cfg.eval_size, t["rows_per_step"]) == (20_000, 200, 32)
    # the recipe packs: its 19,800 rows fill fewer packed rows than a step per 32 rows (619) would take
    assert t["steps"] == t["plan"].steps_per_epoch < math.ceil(19_800 / 32) == 619
    assert t["step"]["tokens_per_gpu"] == 2 * 2048 * 8
    assert t["step"]["n_gpus"] == 2 and t["step"]["mfu"] == book_assumptions()["mfu"]
    assert t["epoch_s"] == pytest.approx(t["steps"] * t["step"]["step_s"])
    assert f"about **{duration(t['step']['step_s'])}**" in text
    assert f"about **{duration(t['epoch_s'])}**" in text and t["mfu_text"] in text


def test_summary_checks_fill_in_the_recipes_values():
    lines = two_gpu_run.summary_checks_markdown().splitlines()
    assert len(lines) == len(two_gpu_run.SUMMARY_CHECKS)
    units = next(line for line in lines if line.startswith("- `effective.evidence.fsdp_units`"))
    assert "37: one unit per decoder layer (36) and the root" in units  # SmolLM3-3B has 36 decoder layers
    assert "0.5 on each of the 2 ranks" in next(line for line in lines if "fraction_per_rank" in line)
    versions = next(line for line in lines if line.startswith("- `versions`"))
    assert "torch 2.13.0" in versions and "trl 1.16.0" in versions


def test_lookup_names_the_missing_key():
    assert two_gpu_run.lookup({"a": {"b": 1}}, "a.b") == 1
    with pytest.raises(KeyError, match="missing 'c'"):
        two_gpu_run.lookup({"a": {"b": 1}}, "a.c")
