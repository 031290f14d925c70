"""FSDP mechanics recorded on 2 ranks: shards, collectives in order, state dicts, freezing."""

import re

import pytest

from smolfsdp.book import fsdp_versions
from smolfsdp.probes.mechanics import measure_mechanics
from smolfsdp.traces.classify import collective_kind


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    return measure_mechanics(2, tmp_path_factory.mktemp("mech"))


@pytest.fixture(scope="module")
def fsdp1(tmp_path_factory):
    return measure_mechanics(1, tmp_path_factory.mktemp("mech"))


def test_collective_names():
    assert collective_kind("c10d::_allgather_base_") == "all-gather"
    assert collective_kind("c10d::allgather_") == "all-gather"
    assert collective_kind("c10d::_reduce_scatter_base_") == "reduce-scatter"
    assert collective_kind("c10d::allreduce_") == "all-reduce"
    assert collective_kind("aten::mm") is None


def test_each_rank_holds_half(fsdp1, fsdp2):
    for res in (fsdp1, fsdp2):
        full = res[0]["full_param_bytes"]
        for r in res:
            assert abs(r["param_bytes"] - full / 2) <= 0.01 * full, r["fsdp_version"]
            assert r["optimizer_bytes"] == 2 * r["param_bytes"]  # Adam m and v, fp32, sharded like the params


def test_fsdp2_dtensor_shard0_per_parameter(fsdp2):
    for r in fsdp2:
        for row in r["sharding"]:
            assert row["type"] == "DTensor" and row["placement"] == "(Shard(dim=0),)"
            assert abs(row["local_shape"][0] - row["global_shape"][0] / 2) <= 0.5


def test_fsdp1_flat_parameters_one_per_unit(fsdp1):
    n_layers = len([k for k in fsdp1[0]["unit_params"] if k.startswith("model.layers.")])
    rows = fsdp1[0]["sharding"]
    assert len(rows) == n_layers + 1 and all(r["type"] == "FlatParameter" for r in rows)
    assert sum(r["global_numel"] for r in rows) == sum(fsdp1[0]["unit_params"].values())


def test_fsdp2_gathers_before_forward_and_backward_and_reduce_scatters_after(fsdp2):
    names = [e["name"] for e in fsdp2[0]["events"] if e["kind"] == "annotation"]
    n_layers = len([k for k in fsdp2[0]["unit_params"] if k.startswith("model.layers.")])
    for i in range(n_layers):
        unit = f"(model.layers.{i})"
        gathers = [j for j, n in enumerate(names) if n == f"FSDP::all_gather {unit}"]
        assert len(gathers) == 2  # once for forward, once again for backward (resharded in between)
        fwd, bwd = names.index(f"FSDP::pre_forward {unit}"), names.index(f"FSDP::pre_backward {unit}")
        assert fwd < gathers[0] < names.index(f"FSDP::post_forward {unit}") < gathers[1]
        assert names.index(f"FSDP::post_backward_reduce {unit}") > bwd
    # backward prefetch: layer i-1's all-gather is issued while layer i is still in backward
    for i in range(n_layers - 1, 0, -1):
        pre = names.index(f"FSDP::backward_prefetch for model.layers.{i - 1}")
        assert pre < names.index(f"FSDP::post_backward_reduce (model.layers.{i})")
    kinds = [e["kind"] for e in fsdp2[0]["events"]]
    assert kinds.count("reduce-scatter") == n_layers + 1


def test_state_dicts(fsdp1, fsdp2):
    assert fsdp2[0]["state_dict"]["value_type"] == "DTensor" and fsdp2[0]["state_dict"]["collectives"] == 0
    sd1 = fsdp1[0]["state_dict"]
    assert sd1["value_type"] == "ShardedTensor" and sd1["local_shape"][0] * 2 == sd1["global_shape"][0]
    assert sd1["collectives"] > 0  # FSDP1's SHARDED_STATE_DICT communicates to build ShardedTensor metadata


def test_freezing_one_parameter(fsdp1, fsdp2):
    assert fsdp2[0]["freeze_one_param"]["per-parameter"]["ok"]
    assert fsdp1[0]["freeze_one_param"]["use_orig_params=True"]["ok"]
    bad = fsdp1[0]["freeze_one_param"]["use_orig_params=False"]
    assert not bad["ok"] and re.search("uniform `requires_grad`", bad["error"])


def test_the_chapters_versions_table_says_which_weight_and_where_a_row_does_not_apply(fsdp1, fsdp2):
    table = fsdp_versions.versions_table({1: fsdp1, 2: fsdp2})
    key = "sharded state dict: model.layers.0.self_attn.q_proj.weight, rank 0's shape of the full one"
    assert table.loc[key, "FSDP1"] == table.loc[key, "FSDP2"] == "64 x 128 of 128 x 128"
    assert table.loc["sharded state dict: value type"].tolist() == ["ShardedTensor", "DTensor"]
    assert table.loc["freeze one weight (per-parameter)", "FSDP1"] == "does not apply"
    assert table.loc["freeze one weight (use_orig_params=True)", "FSDP1"] == "works"
    rows = fsdp_versions.fsdp2_sharding_view(fsdp2[0]["sharding"])
    assert set(rows["placement"]) == {"Shard(0)"}
