"""Mechanism figures: the step probe's counts, bytes and losses, the timeline drawing exactly what its
sentence counts, and the communication volumes in model sizes."""

import pytest

from smolfsdp.book import probe_views
from smolfsdp.book.figures import mechanisms as fm
from smolfsdp.probes.step import measure_step_variants, unit_of


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return measure_step_variants(tmp_path_factory.mktemp("probe"))


def test_unit_names():
    assert unit_of("FSDP::all_gather (model.layers.1)") == "model.layers.1"
    assert unit_of("FSDP::pre_forward") == "root"  # FSDP2 names the root group with no module name
    assert unit_of("FSDP::post_backward_reduce") == "root"
    assert unit_of("FSDP::backward_prefetch for model.layers.2") is None
    assert unit_of("FSDP::root_pre_forward") is None


def test_probe_counts_bytes_and_losses(probe):
    for rank in probe:
        by = {r["variant"]: r for r in rank}
        gathers = {v: sum(c["kind"] == "all-gather" for c in r["collectives"]) for v, r in by.items()}
        assert gathers == {
            "root resharded": 10, "root kept (default)": 9, "nothing resharded": 5, "explicit prefetch": 9,
        }  # fmt: skip
        assert all(sum(c["kind"] == "reduce-scatter" for c in r["collectives"]) == 5 for r in rank)
        assert len({r["loss"] for r in rank}) == 1  # resharding and prefetch change when, never what
        assert by["root resharded"]["root_sharded_between_forward_and_backward"] is True
        assert by["root kept (default)"]["root_sharded_between_forward_and_backward"] is False
    table = fm.probe_vs_model(probe[0])  # every measured size equals comm.estimate_collectives'
    assert (table["measured (count)"] == table["model (count)"]).all()
    assert (table["measured (bytes)"] == table["model (bytes)"]).all()


def test_timeline_draws_what_the_sentence_counts(probe):
    default = next(r for r in probe[0] if r["variant"] == "root kept (default)")
    counts = fm.collective_counts(default["events"])
    assert counts == {
        "all-gather in forward": 5,
        "all-gather in backward": 4,
        "reduce-scatter in backward": 5,
    }
    fig = fm.plot_step_timeline(default["events"])
    drawn = [t for t in fig.data if t.name in ("all-gather", "reduce-scatter")]
    assert (
        sum(t.name == "all-gather" for t in drawn) == 9
        and sum(t.name == "reduce-scatter" for t in drawn) == 5
    )
    span = max(e["start_us"] + e["dur_us"] for e in default["events"] if e["kind"] == "phase") / 1e3
    assert min(t.x[0] for t in drawn) >= 0.03 * span - 1e-9  # no hairlines
    lanes = {t.y[0] for t in drawn}
    assert lanes == {"root", "layer 0", "layer 1", "layer 2", "layer 3"}
    assert all(t.text[0] in ("AG", "RS") for t in drawn)


def test_comm_volumes_in_model_sizes():
    df = fm.comm_volume_table("tiny", n_gpus=8)
    ring = 7 / 8
    assert df.loc["DDP (NO_SHARD)", "total"] == pytest.approx(2 * ring, rel=0.01)  # one all-reduce
    assert df.loc["ZeRO-2 (SHARD_GRAD_OP)", "total"] == pytest.approx(2 * ring, rel=0.01)
    zero1 = df.loc["ZeRO-1 (optimizer state)"]  # DDP's all-reduce as its two halves
    assert zero1["all-reduce"] == 0 and zero1["reduce-scatter"] == zero1["all-gather"] == pytest.approx(
        ring, rel=0.01
    )
    assert zero1["total"] == df.loc["DDP (NO_SHARD)", "total"]
    assert df.loc["FULL_SHARD, root resharded", "total"] == pytest.approx(3 * ring, rel=0.01)
    kept = df.loc["ZeRO-3 / FSDP (FULL_SHARD)", "total"]
    assert 2 * ring < kept < 3 * ring  # the root's backward all-gather saved


def test_tables_are_shaped_for_readers():
    from smolfsdp.probes.mechanics import fsdp_unit_table

    units = fm.unit_table(fsdp_unit_table("tiny"))
    assert units.columns.tolist() == [
        "parameters", "full (KiB)", "shard per rank (KiB)", "held while it computes (KiB)",
    ]  # fmt: skip
    assert units.iloc[1]["parameters"] == "184,576"
    held = fsdp_unit_table("tiny")["held_while_computing_bytes"].tolist()
    shards = 262_400 + 4 * 369_152  # fp32 halves: root 131,200 params, each layer 184,576
    # root: + itself + layer 0 (prefetched); a layer: + itself + the next + the root (gathered all forward)
    assert held == [shards + 262_400 + 369_152] + [shards + 2 * 369_152 + 262_400] * 3 + [
        shards + 369_152 + 262_400
    ]
    sync = fm.no_sync_table("tiny", n_gpus=2, accumulation=4)
    assert sync["reduce-scatters per step"].tolist() == ["20", "5"]  # 5 units x 4 micro-batches, or once
    hfu = fm.mfu_hfu_table("tiny", seq_len=64)
    assert hfu.attrs["rule_hfu_over_mfu"] == pytest.approx(4 / 3)
    # torch stops recomputing before each layer's down_proj: less than the rule (tests/test_recompute.py counts it)
    assert 1.1 < hfu.attrs["hfu_over_mfu"] < hfu.attrs["rule_hfu_over_mfu"]


def test_probe_peaks_come_with_their_spread_and_the_sentences_read_only_what_beats_it(probe):
    for rank in probe:
        for r in rank:
            lo, hi = r["peak_above_start_range_bytes"]
            assert 0 < lo <= r["peak_above_start_bytes"] <= hi, r["variant"]
    by = {r["variant"]: r for r in probe[0]}
    text = probe_views.memory_sentence(by)
    assert all(
        probe_views.peak_range_text(by[v]) in text for v in ("root kept (default)", "nothing resharded")
    )
    root = probe_views.root_reshard_sentence(by["root kept (default)"], by["root resharded"])
    assert "(10 instead of 9)" in root and "the same loss" in root
    assert "128,256 x 2,048 embedding, 0.49 GiB in bf16" in root  # SmolLM3-3B's tied embedding


def test_peaks_differ_only_outside_each_others_range():
    def r(lo, hi):
        return {"peak_above_start_range_bytes": [lo, hi]}

    assert not probe_views.peaks_differ(r(8400, 8983), r(8400, 8912))  # the helper's two executions
    assert probe_views.peaks_differ(r(8400, 8983), r(10273, 10300))
    assert "outside the default's range" in probe_views.memory_sentence(
        {"root kept (default)": r(100, 110), "root resharded": r(105, 108), "nothing resharded": r(200, 201)}
    )
    assert "Every range overlaps" in probe_views.memory_sentence(
        {"root kept (default)": r(100, 110), "root resharded": r(105, 108), "nothing resharded": r(109, 120)}
    )


def _fills(fig, colour: str) -> list:
    return [s for s in fig.layout.shapes if s.fillcolor == colour]


def test_step_schematic_draws_the_layouts_bytes_and_the_models_collectives():
    """The drawn step (issue 41) holds real sizes: each unit's shard and full bytes equal the worked-example
    table built from the meta model, each slot's bytes equal that table's "held while computing" where a unit
    computes, and the collectives equal the communication model's (and the probe's: 9 all-gathers, 5
    reduce-scatters)."""
    from smolfsdp.book.figures import palette, schematics
    from smolfsdp.estimate.comm import estimate_collectives
    from smolfsdp.probes.mechanics import fsdp_unit_table

    sched, units = schematics.step_schedule("tiny", 2), schematics.unit_bytes("tiny", 2)
    table = fsdp_unit_table("tiny", world_size=2)
    rows = {"root": table.iloc[0], **{f"layer {i}": table.loc[f"model.layers.{i}"] for i in range(4)}}
    for u, row in rows.items():
        assert (
            units[u]["full"] == row["full_bytes"] and units[u]["shard"] == [row["shard_bytes_per_rank"]] * 2
        )
    computing = {c.split(": ")[0]: r for c, r in zip(sched["compute"], sched.itertuples(), strict=True)
                 if r.phase == "forward" and isinstance(c, str) and c.endswith(("forward", "embedding"))}  # fmt: skip
    for u, row in rows.items():  # the forward slot of each unit (the root: its embedding)
        assert computing[u].held_bytes_rank0 == row["held_while_computing_bytes"], u
    assert (sched["held_bytes_rank0"] == sched["held_bytes_rank1"]).all()
    kinds = [k for c in sched["collectives"] for k, _ in c]
    coll = estimate_collectives("tiny", n_gpus=2, fsdp_version=2, mixed_precision="no")
    for kind, n in (("all-gather", 9), ("reduce-scatter", 5)):
        assert kinds.count(kind) == coll.loc[coll["kind"].eq(kind), "count"].sum() == n
    fig = schematics.plot_step_schematic(sched, units)
    assert len(_fills(fig, palette.COLLECTIVE["all-gather"])) == 9
    assert len(_fills(fig, palette.COLLECTIVE["reduce-scatter"])) == 5
    assert len(_fills(fig, palette.TRACE_CATEGORY["compute"])) == 2 * sched["compute"].map(type).eq(str).sum()
    bars = [t for t in fig.data if t.type == "bar"]
    drawn = [sum(t.y[i] for t in bars) for i in range(len(sched))]
    assert drawn == pytest.approx((sched["held_bytes_rank0"] / 1024).tolist())
    rank1 = next(t for t in fig.data if t.name == "rank 1: total")
    assert list(rank1.y) == pytest.approx((sched["held_bytes_rank1"] / 1024).tolist())
    said = schematics.step_schematic_reading(sched, units)
    assert (
        f"{sched['held_bytes_rank0'].max() / 1024:,.1f} KiB" in said
        and "9 all-gathers and 5 reduce-scatters" in said
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_flat_vs_dtensor_pieces_equal_the_layouts_shards(world_size):
    """Each rank's pieces in the drawing are the layout's: FSDP1's per-parameter elements on each rank equal
    ``flat_layout`` (3 ranks: with its padding), FSDP2's rows times columns equal ``dim0_layout``."""
    from smolfsdp.book.figures import palette, schematics
    from smolfsdp.estimate.layout import dim0_layout, flat_layout
    from smolfsdp.estimate.params import model_units, resolve_model_config

    params = model_units(resolve_model_config("tiny"))["model.layers.0"]
    seg = schematics.shard_segments("tiny", "model.layers.0", world_size=world_size)
    flat, two = seg["fsdp1"], seg["fsdp2"]
    for r in range(world_size):
        shard, local = flat_layout(params, world_size, r, 4)
        mine = flat[flat["rank"] == r]
        assert int((mine["end"] - mine["start"]).sum()) == shard
        for p, n in zip(params, local, strict=True):
            piece = mine[mine["parameter"] == schematics._short(p.name)]
            assert int((piece["end"] - piece["start"]).sum()) == n, (r, p.name)
            rows = two[(two["parameter"] == schematics._short(p.name)) & (two["rank"] == r)].iloc[0]
            assert (rows["row_end"] - rows["row_start"]) * rows["cols"] == dim0_layout(p, world_size, r)[1]
    padding = flat[flat["parameter"] == "padding"]
    assert int((padding["end"] - padding["start"]).sum()) == world_size * shard - sum(p.numel for p in params)
    if world_size == 2:
        fig = schematics.plot_flat_vs_dtensor(seg)
        wide = [s for s in fig.layout.shapes if s.yref == "y"]  # row 1: the flat buffer
        for r in range(2):
            drawn = sum(s.x1 - s.x0 for s in wide if s.fillcolor == palette.SHARD[f"rank {r}"])
            assert drawn == shard
        said = schematics.flat_vs_dtensor_reading(seg)
        assert f"{shard:,} elements on each rank" in said and "43,136 elements of `gate_proj`" in said
