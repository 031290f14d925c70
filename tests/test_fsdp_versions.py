"""The FSDP1-vs-FSDP2 views: LoRA gradients per version, reader-shaped sharding tables."""

import pytest

from smolfsdp.book import fsdp_versions as fv
from smolfsdp.estimate.params import LoraSpec, count_parameters, resolve_model_config

GIB = 2**30


def test_lora_gradient_fsdp1_covers_whole_flat_shards_fsdp2_only_adapters():
    config = resolve_model_config("smollm3-3b")
    lora = count_parameters(config, LoraSpec())
    g = fv.lora_gradient_gib()
    # FSDP2: fp32 gradients of the adapters only, halved over 2 ranks
    assert g["FSDP2"] * GIB == lora.trainable // 2 * 4
    # FSDP1: every decoder layer's FlatParameter holds an adapter, so its whole shard gets a gradient
    whole = lora.n_layers * (lora.per_layer // 2) * 4
    assert g["FSDP1"] * GIB == pytest.approx(whole, rel=1e-5)
    table = fv.lora_state_table()
    # GiB everywhere (smolfsdp.book.tables.UNIT_RULE): 3 decimals under 0.1 GiB, so the adapters' state shows
    assert table.loc[("FSDP2", "LoRA"), "gradients (GiB)"] == f"{g['FSDP2']:,.3f}" == "0.007"
    assert table.loc[("FSDP2", "LoRA"), "Adam m + v (GiB)"] == f"{lora.trainable // 2 * 8 / GIB:,.3f}"
    assert table.loc[("FSDP2", "full fine-tune"), "Adam m + v (GiB)"] == "11.46"
    assert not any("MiB" in c for c in table.columns) and table.attrs["settings"]


def test_sharding_views_have_no_python_reprs():
    rows1 = [dict(name="model.layers.0", type="FlatParameter", original_params=9, global_numel=1000,
                  local_numel=500, padding=0, dtype="float32")]  # fmt: skip
    rows2 = [dict(name="model.embed_tokens.weight", type="DTensor", placement="(Shard(dim=0),)",
                  local_shape=(512, 64), global_shape=(1024, 64))]  # fmt: skip
    v1, v2 = fv.fsdp1_sharding_view(rows1), fv.fsdp2_sharding_view(rows2)
    assert v1.loc["model.layers.0", "elements, whole unit"] == "1,000"
    assert v2.loc["model.embed_tokens.weight", "shape held by this rank"] == "512 x 64"
    assert "(" not in v2.loc["model.embed_tokens.weight", "full shape"]
