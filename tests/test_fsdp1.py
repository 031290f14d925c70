"""The FSDP arguments the Trainer receives for the seed's settings, and fsdp_config checking."""

import pytest
import torch

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.sharding.fsdp1 import check_hf_fsdp_config, hf_fsdp_config


def test_seed_settings():
    cfg = hf_fsdp_config(1, "SmolLM3DecoderLayer")
    assert cfg["version"] == 1
    assert cfg["transformer_layer_cls_to_wrap"] == ["SmolLM3DecoderLayer"]
    assert cfg["backward_prefetch"] == "BACKWARD_PRE"
    assert cfg["state_dict_type"] == "SHARDED_STATE_DICT"
    assert cfg["reshard_after_forward"] == "full_shard"  # FULL_SHARD in FSDP1 terms
    assert cfg["cpu_offload"] is False


def test_the_chapter_shows_the_config_the_run_passes():
    """``trl_args`` builds its fsdp_config with ``trainer_fsdp_config``, which the chapter shows."""
    from smolfsdp.train.trl_engine import trainer_fsdp_config  # deferred: imports trl

    recipe_cfg = TrainConfig(engine="trl", cpu_offload=True)
    on_cpu = trainer_fsdp_config(recipe_cfg, "SmolLM3DecoderLayer", on_cpu=True)
    on_gpu = trainer_fsdp_config(recipe_cfg, "SmolLM3DecoderLayer", on_cpu=False)
    assert on_cpu["sync_module_states"] is False and on_gpu["sync_module_states"] is True
    assert {k: v for k, v in on_cpu.items() if k != "sync_module_states"} == {
        k: v for k, v in on_gpu.items() if k != "sync_module_states"
    }
    assert on_cpu["cpu_offload"] is True and on_cpu["backward_prefetch"] == "BACKWARD_PRE"


def _trainer_args(rank, world):
    """SFTConfig for three settings, built inside a 2-rank group as the Trainer would be."""
    from smolfsdp.train.trl_engine import trl_args

    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = {}
    for key, cfg in {
        "seed": TrainConfig(engine="trl"),
        "offload": TrainConfig(engine="trl", cpu_offload=True),
        "v2": TrainConfig(engine="trl", fsdp_version=2),
    }.items():
        args = trl_args(cfg, info, f"/tmp/smolfsdp-test-trainer-{rank}", "SmolLM3DecoderLayer")
        out[key] = {
            "plugin": dict(args.fsdp_plugin_args),
            "activation_checkpointing": args.activation_checkpointing,
            "bf16": args.bf16,
        }
    return out


def test_trainer_receives_seed_fsdp_plugin_args():
    """What accelerate's FullyShardedDataParallelPlugin is built from, via transformers' own parsing."""
    from _dist import run_distributed

    got = run_distributed(_trainer_args, 2)[0]
    plugin = got["seed"]["plugin"]
    assert plugin["fsdp_version"] == 1
    assert plugin["transformer_cls_names_to_wrap"] == "SmolLM3DecoderLayer"
    assert plugin["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin["backward_prefetch"] == "BACKWARD_PRE"
    assert plugin["state_dict_type"] == "SHARDED_STATE_DICT"
    assert plugin["reshard_after_forward"] == "full_shard"
    assert plugin["sync_module_states"] is False  # on CPU it would raise "no available devices"
    # TRL defaults bf16=True and gradient (activation) checkpointing on; both are overridden on CPU
    assert got["seed"]["activation_checkpointing"] is False and got["seed"]["bf16"] is False
    assert got["offload"]["plugin"]["cpu_offload"] is True
    assert got["v2"]["plugin"]["fsdp_version"] == 2 and got["v2"]["plugin"]["reshard_after_forward"] is True


def test_unknown_key_suggests_nearest_and_leaves_caller_dict_alone():
    mine = {"fsdp_backward_prefetch": "BACKWARD_PRE", "transformer_layer_cls_to_wrap": ["X"]}
    before = {k: (list(v) if isinstance(v, list) else v) for k, v in mine.items()}
    out = check_hf_fsdp_config(mine)
    assert out["backward_prefetch"] == "BACKWARD_PRE"  # prefix stripped in the copy
    assert mine == before
    with pytest.raises(ConfigError, match="did you mean 'backward_prefetch'"):
        check_hf_fsdp_config({"backward_prefech": "BACKWARD_PRE"})
    with pytest.raises(ConfigError, match="did you mean 'state_dict_type'"):
        hf_fsdp_config(1, "X", extra={"state_dict_typ": "FULL_STATE_DICT"})


def _rope_after_bf16_wrap(rank, world):
    """Wrap the tiny SmolLM3 with FSDP1 in bf16, run one forward (FSDP1 casts buffers at the root's
    first forward), then read ``inv_freq`` and the rotary cos/sin at the last position."""
    from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
    from smolfsdp.sharding.fsdp1 import wrap_fsdp1

    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    wrapped = wrap_fsdp1(model, resolve_wrap_class(model), param_dtype=torch.bfloat16)
    with torch.no_grad():
        wrapped(input_ids=torch.arange(3, 19).unsqueeze(0))
        rotary = wrapped.module.model.rotary_emb
        position = torch.tensor([[2047]])  # the last position of max_position_embeddings=2048
        cos, sin = rotary(torch.zeros(1, 1, 8, dtype=torch.bfloat16), position)
    return {"inv_freq": rotary.inv_freq.clone(), "cos": cos, "sin": sin}


def test_bf16_fsdp1_keeps_rotary_buffers_fp32():
    """MixedPrecision(buffer_dtype=bf16) used to cast RoPE's inv_freq to bf16: at position 2047 the
    angles then differ from the fp32 model's. The policy keeps buffers fp32."""
    from _dist import run_distributed

    from smolfsdp.models.modeling import build_model, load_tokenizer
    from smolfsdp.sharding.fsdp1 import mixed_precision_policy

    policy = mixed_precision_policy(torch.bfloat16)
    assert (policy.param_dtype, policy.reduce_dtype, policy.buffer_dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
    )
    assert mixed_precision_policy(None) is None
    ref = build_model("tiny", load_tokenizer("tiny"), seed=0).model.rotary_emb
    with torch.no_grad():
        cos, sin = ref(torch.zeros(1, 1, 8, dtype=torch.bfloat16), torch.tensor([[2047]]))
    for got in run_distributed(_rope_after_bf16_wrap, 2):
        assert got["inv_freq"].dtype == torch.float32
        assert torch.equal(got["inv_freq"], ref.inv_freq)
        assert torch.equal(got["cos"], cos) and torch.equal(got["sin"], sin)
