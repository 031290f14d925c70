"""The scaling chapter's views: the book's recipe, reader-shaped tables, and the tokens-per-step sweep."""

import pandas as pd
import pytest

from smolfsdp.book import scaling_views as sv
from smolfsdp.estimate.scaling import estimate_step, scaling_table


def test_assumptions_come_from_the_full_recipe():
    a = sv.book_assumptions()
    assert (a["seq_len"], a["micro_batch"], a["gradient_accumulation_steps"], a["fsdp_version"]) == (
        2048,
        2,
        8,
        1,
    )
    assert a["activation_checkpointing"] is True
    assert "4,096 tokens per GPU per micro-batch" in sv.assumptions_markdown(a)


def test_tables_are_words_not_nan():
    a = sv.book_assumptions()
    scaling = scaling_table(["smollm3-3b"], n_gpus=(2, 8, 16), **a)
    fits = sv.fits_from_view(scaling)
    assert fits.loc["smollm3-3b", "FULL_SHARD (ZeRO-3)"] == "from 2 GPUs"
    tiny_gpu = scaling_table(["smollm3-3b"], strategies=("NO_SHARD",), n_gpus=(2, 4), **{**a, "gpu": "A10G"})
    assert sv.fits_from_view(tiny_gpu).loc["smollm3-3b", "NO_SHARD (DDP)"] == "not up to 4 GPUs"
    eff = sv.efficiency_view(scaling, n_gpus=(8, 16))
    assert eff.shape == (2, 4) and all(str(v).endswith("%") for v in eff.to_numpy().ravel())
    big = sv.efficiency_view(scaling_table(["smollm3-3b"], n_gpus=(8, 1024), **a), n_gpus=(8, 1024))
    assert list(big.index.get_level_values("GPUs")) == ["8", "1,024"]  # as the prose writes them, in order
    shown = sv.preview(scaling).to_string()
    assert "nan" not in shown.lower() and "..." not in shown
    # the one verdict's word, with the need it is decided on and the tensor peak in brackets
    row = sv.preview(scaling).iloc[0]
    first = scaling[scaling["n_gpus"].isin((2, 16, 1024))].iloc[0]
    assert row["verdict"] == first["verdict"] and set(scaling["verdict"]) <= {"fits", "tight", "does not fit"}
    assert (
        row["needed per GPU, GiB (tensor peak)"] == f"{first['need_gib']:,.1f} ({first['memory_gib']:,.1f})"
    )
    words = pd.DataFrame(
        {
            "model": "m",
            "strategy": "FULL_SHARD",
            "n_gpus": [2, 4, 8, 16],
            "verdict": ["does not fit", "tight", "fits", "fits"],
        }
    )
    assert sv.fits_from_view(words).loc["m", "FULL_SHARD (ZeRO-3)"] == "from 8 GPUs (tight at 4)"
    tight_only = words.assign(verdict=["does not fit", "tight", "tight", "tight"])
    assert (
        sv.fits_from_view(tight_only).loc["m", "FULL_SHARD (ZeRO-3)"]
        == "not up to 16 GPUs (tight at 4, 8, 16)"
    )


def test_accumulation_alone_does_not_move_efficiency_but_tokens_and_no_sync_do():
    a = sv.book_assumptions()
    kw = {k: a[k] for k in ("gpu", "gpus_per_node", "network", "mfu", "seq_len", "fsdp_version")}
    one = estimate_step("smollm3-3b", n_gpus=16, micro_batch=2, gradient_accumulation_steps=1, **kw)
    eight = estimate_step("smollm3-3b", n_gpus=16, micro_batch=2, gradient_accumulation_steps=8, **kw)
    assert abs(one["efficiency"] - eight["efficiency"]) < 1e-9
    sweep = sv.tokens_sweep(a, micro_batches=(1, 2))
    fs = sweep[sweep["strategy"] == "FULL_SHARD (ZeRO-3)"].set_index(
        ["tokens per GPU per micro-batch", "gradient reduction"]
    )
    every, once = fs.loc[("4,096", "every micro-batch (8x)")], fs.loc[("4,096", "once per step (no_sync)")]
    assert abs(every["_efficiency"] - eight["efficiency"]) < 1e-9
    assert once["_efficiency"] > every["_efficiency"]
    assert float(once["memory per GPU (GiB)"]) > float(every["memory per GPU (GiB)"])
    assert (
        fs.loc[("4,096", "every micro-batch (8x)"), "_efficiency"]
        > fs.loc[("2,048", "every micro-batch (8x)"), "_efficiency"]
    )
    view = sv.tokens_sweep_view(sweep)
    assert list(view.index) == ["2,048", "4,096"] and view.shape == (2, 4)
    assert "GiB" in view.iloc[0, 0]
    said = sv.no_sync_markdown(sweep, a)  # the recipe's 2,048 x 2 tokens, not a typed-in count
    assert (
        f"at 4,096 tokens from {every['efficiency']} to {once['efficiency']}" in said and "no_sync()" in said
    )
    extra = float(once["memory per GPU (GiB)"]) - float(every["memory per GPU (GiB)"])
    assert f"costs {extra:,.1f} GiB more per GPU" in said
    at_1 = sv.no_sync_markdown(sweep, {**a, "micro_batch": 1})
    assert "at 2,048 tokens" in at_1
    with pytest.raises(ValueError, match="no FULL_SHARD rows at 16,384 tokens"):
        sv.no_sync_markdown(sweep, {**a, "micro_batch": 8})
    assert isinstance(view, pd.DataFrame)


def test_ddp_rows_sync_once_per_step_and_show_the_cost_of_not():
    a = sv.book_assumptions()
    view = sv.ddp_sync_view(a, n_gpus=(8, 16))
    once, every = "once per step (no_sync)", f"every micro-batch ({a['gradient_accumulation_steps']}x)"
    gib = {c: float(view.loc["16", (c, "all-reduced per step (GiB)")]) for c in (once, every)}
    assert gib[every] == pytest.approx(a["gradient_accumulation_steps"] * gib[once], rel=0.01)
    eff = {c: float(view.loc["16", (c, "efficiency")].rstrip("%")) for c in (once, every)}
    assert eff[once] > 2 * eff[every]  # two nodes: the per-micro-batch sync is what made DDP look unusable
    table = scaling_table(["smollm3-3b"], strategies=("NO_SHARD",), n_gpus=(16,), **a)  # the chapter's rows
    assert f"{table['efficiency'].iloc[0]:.1%}" == view.loc["16", (once, "efficiency")]
    said = sv.ddp_sync_markdown(view, a)
    assert (
        f"16 GPUs: {view.loc['16', (once, 'efficiency')]} against {view.loc['16', (every, 'efficiency')]}"
        in said
    )
    assert "no_sync()" in sv.assumptions_markdown(a)


def test_log_axes_are_labelled_at_decades():
    from smolfsdp.book.figures import scale as plotting_scale
    from smolfsdp.estimate.params import llama3_70b_config

    a = sv.book_assumptions()
    models = ["smollm3-3b", llama3_70b_config()]  # the chapter's two
    scaling = scaling_table(models, strategies=("NO_SHARD", "FULL_SHARD"), n_gpus=(2, 1024), **a)
    for fig in (plotting_scale.plot_memory_vs_gpus(scaling), plotting_scale.plot_scaling(scaling, "step_s")):
        assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1
        assert fig.layout.yaxis.exponentformat == "none"
    assert plotting_scale.decade_ticks(2.0, 8.0) == {}  # under one labelled decade: keep plotly's ticks
    assert plotting_scale.decade_ticks(0.5, 20.0)["dtick"] == 1
