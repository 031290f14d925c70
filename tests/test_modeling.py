"""The tiny SmolLM3 preset and wrap-class discovery / checking."""

import pytest

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch.validate import validate
from smolfsdp.models.modeling import (
    build_meta_model,
    build_model,
    count_parameters,
    discover_wrap_class,
    resolve_wrap_class,
    tiny_config,
)


def test_tiny_preset_is_a_real_smollm3(tokenizer):
    model = build_model("tiny", tokenizer)
    cfg = model.config
    assert type(model).__name__ == "SmolLM3ForCausalLM"
    assert cfg.num_hidden_layers % 4 == 0 and 0 in cfg.no_rope_layers  # a NoPE layer exists
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        assert 0 <= getattr(cfg, key) < cfg.vocab_size
    emb = cfg.vocab_size * cfg.hidden_size
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())  # tied counted once
    assert count_parameters(model) < sum(
        p.numel() for p in model.state_dict().values()
    )  # state dict has both
    assert emb == model.model.embed_tokens.weight.numel()


def test_same_seed_same_weights(tokenizer):
    a, b = build_model("tiny", tokenizer, seed=3), build_model("tiny", tokenizer, seed=3)
    assert all((pa == pb).all() for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def test_wrap_class_is_discovered(tokenizer):
    model = build_meta_model("tiny", tokenizer)
    assert discover_wrap_class(model) == "SmolLM3DecoderLayer"
    assert resolve_wrap_class(model).__name__ == "SmolLM3DecoderLayer"


def test_wrong_case_wrap_class_suggests_right_one(tokenizer):
    model = build_meta_model("tiny", tokenizer)
    with pytest.raises(ConfigError, match="Did you mean 'SmolLM3DecoderLayer'"):
        resolve_wrap_class(model, "Smollm3DecoderLayer")
    with pytest.raises(ConfigError, match="not a module class"):
        resolve_wrap_class(model, "LlamaDecoderLayer")


@pytest.mark.parametrize(
    "bad",
    [" SmolLM3DecoderLayer", "SmolLM3DecoderLayer,", "SmolLM3DecoderLayer, ", "SmolLM3DecoderLayer,Foo"],
)
def test_wrap_class_with_stray_spaces_or_commas(bad):
    with pytest.raises(ConfigError, match="stray spaces or commas.*'SmolLM3DecoderLayer'"):
        validate(TrainConfig(wrap_class=bad))


@pytest.mark.parametrize("empty", ["", "  ", ","])
def test_empty_wrap_class(empty):
    with pytest.raises(ConfigError, match="wrap_class is empty"):
        validate(TrainConfig(wrap_class=empty))


def test_unknown_preset(tokenizer):
    with pytest.raises(ConfigError, match="Unknown model preset 'tinyy'"):
        build_meta_model("tinyy", tokenizer)


def test_tiny_config_checks_special_ids(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"pad_token": "<|newpad|>"})
    assert tiny_config(tok).pad_token_id == len(tok) - 1  # inside the grown vocabulary
