"""The H200 measurements of padding, packing and checkpointing (data/results/h200/), as the page reads them."""

import json

import pytest

from smolfsdp.book.measured_throughput import measured_facts, measured_markdown, measured_table
from smolfsdp.paths import repo_root

H200 = repo_root() / "data" / "results" / "h200"


def test_ratios_are_the_committed_medians():
    rows = json.loads((H200 / "gpu_throughput.json").read_text())["rows"]
    med = {(r["batch"], r["activation_checkpointing"]): r["median_s"] for r in rows}
    f = measured_facts()
    assert f["device"] == "NVIDIA H200"
    assert f["ac_cost"] == pytest.approx(med["causal", True] / med["causal", False])
    assert 1.3 < f["ac_cost"] < 1.7  # 325.0 / 215.1 ms on 2026-12-04
    assert f["mask_cost"] == pytest.approx(med["packed", False] / med["causal", False])
    assert f["padded_real_share"] == pytest.approx((2048 + 1331) / 4096)
    table = measured_table()
    assert len(table) == len(rows) == 8 and set(table["activation checkpointing"]) == {"on", "off"}


def test_rows_apart_on_the_gpu():
    f = measured_facts()
    assert f["rows_apart"]["fp32"] < 1e-3 * f["max_abs_logit"]  # packed == alone, kernels' rounding aside
    assert f["rows_apart"]["fp32_use_cache"] > 1.0  # the KV cache on: no packed-row mask, rows mix
    text = measured_markdown()
    assert "no FSDP" in text and "Measured on one NVIDIA H200" in text


def test_absent_files_say_so(tmp_path):
    assert measured_table(str(tmp_path)) is None and measured_facts(str(tmp_path)) is None
    assert measured_markdown(str(tmp_path)).startswith("**No GPU measurement")


def test_break_even_share_is_packed_real_over_padded_computed_rate():
    rows = {
        (r["batch"], r["activation_checkpointing"]): r
        for r in json.loads((H200 / "gpu_throughput.json").read_text())["rows"]
    }
    pk, pd_ = rows["packed", False], rows["padded", False]
    want = (pk["tokens_real"] / pk["median_s"]) / (pd_["tokens_computed"] / pd_["median_s"])
    f = measured_facts()
    assert f["break_even_share"] == pytest.approx(want) and 0.85 < want < 0.92  # 15,476 / 17,422 tok/s
    assert f"break even where padded rows are {100 * want:.0f} % real" in measured_markdown()
