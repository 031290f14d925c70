"""The parameter counts `smolfsdp memory` reads from a config's numbers equal the meta-device model's, parameter
by parameter (name, size, first dimension, trainable), for the shipped, tiny and Llama configs, with LoRA too."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from smolfsdp.estimate.params import (
    LoraSpec,
    _analytic_units,
    _meta_units,
    llama3_8b_config,
    resolve_model_config,
)

LORA_ALL = LoraSpec(r=16, alpha=32, targets=("q_proj", "v_proj", "gate_proj", "down_proj"))


def _biased_llama():
    return LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=300, attention_bias=True, mlp_bias=True, tie_word_embeddings=False, head_dim=24,
    )  # fmt: skip


@pytest.mark.parametrize("lora", [None, LoraSpec(), LORA_ALL], ids=["full", "lora-qkvo", "lora-mixed"])
@pytest.mark.parametrize("which", ["smollm3-3b", "tiny", "llama3-8b", "biased-llama"])
def test_analytic_units_equal_the_meta_model(which, lora):
    config = {"llama3-8b": llama3_8b_config, "biased-llama": _biased_llama}.get(which, lambda: None)()
    config = config or resolve_model_config(which)
    analytic, meta = _analytic_units(config, lora), _meta_units(config, lora)
    assert analytic[1] == meta[1]  # the decoder layer class FSDP wraps
    assert analytic[2] == meta[2]  # buffer bytes (rotary inv_freq twice)
    assert list(analytic[0]) == list(meta[0])
    for unit, specs in meta[0].items():
        assert analytic[0][unit] == specs, unit
