"""The AdamW step each engine builds (smolfsdp.estimate.adamw_step) and what each adds to the optimizer moment.

The TRL engine's Trainer builds ``AdamW(fused=True)`` (transformers' default ``adamw_torch_fused``), the native
engine's ``make_optimizer`` leaves the choice to torch (foreach on CUDA, a per-parameter loop on CPU); the
estimator's optimizer moment adds foreach's v-sized ``sqrt(v)``, the loop's one-parameter temporaries, or nothing.
The dry run holds the three to what torch allocates (``tests/test_dryrun.py``).
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from trl import SFTConfig

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.estimate import adamw_step
from smolfsdp.estimate.adamw_step import (
    TRAINER_DEFAULT_OPTIM,
    adamw_temporary_bytes,
    built_adamw,
    engine_optimizer,
    traced_adamw,
    trainer_default_optim,
)
from smolfsdp.estimate.layout import sharded_state
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.estimate.recipes import RECIPES
from smolfsdp.sharding.distributed import DistInfo

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


def test_each_engine_builds_its_adamw_on_each_device():
    assert trainer_default_optim() == "adamw_torch_fused"  # transformers 5 with torch >= 2.8
    assert trainer_default_optim() == TRAINER_DEFAULT_OPTIM  # the constant `smolfsdp memory` reads, light
    # TRL's SFTConfig keeps the Trainer's default, which the TRL engine does not override
    assert {f.name: f.default for f in dataclasses.fields(SFTConfig)}["optim"] == trainer_default_optim()
    assert engine_optimizer("trl") == engine_optimizer("trl", "cpu") == "fused"
    assert (engine_optimizer("native"), engine_optimizer("native", "cpu")) == ("foreach", "for-loop")
    with pytest.raises(ConfigError, match="Unknown engine 'trll'; did you mean 'trl'"):
        engine_optimizer("trll")


def test_the_trl_engines_trainer_builds_a_fused_adamw(tmp_path):
    """The Trainer the TRL engine builds (``trl_args``, ``SmolSFTTrainer``), on the tiny model on CPU: its optimizer
    is ``AdamW(fused=True)``, what ``engine_optimizer("trl", "cpu")`` says, and it steps there."""
    from smolfsdp.data.prepare import prepare_data
    from smolfsdp.models.modeling import build_model, load_tokenizer
    from smolfsdp.train.trl_engine import trl_args
    from smolfsdp.train.trl_trainer import SmolSFTTrainer

    cfg = TrainConfig(engine="trl", max_steps=1)
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
    model = build_model(cfg.model, tokenizer, seed=cfg.seed)
    args = trl_args(cfg, CPU, str(tmp_path / "trainer"), "SmolLM3DecoderLayer")
    assert args.optim == trainer_default_optim()
    data = prepare_data(cfg, tokenizer)
    trainer = SmolSFTTrainer(model=model, args=args, train_dataset=data.train, eval_dataset=data.eval,
                             processing_class=tokenizer, smol_cfg=cfg, run_dir=tmp_path)  # fmt: skip
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True
    assert built_adamw(optimizer) == engine_optimizer("trl", "cpu") == "fused"
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = next(model.parameters()).detach().clone()
    optimizer.step()
    assert not torch.equal(before, next(model.parameters()))


def test_the_native_engine_leaves_the_choice_to_torch():
    from smolfsdp.models.modeling import build_model, load_tokenizer
    from smolfsdp.train.native import make_optimizer

    cfg = TrainConfig()
    model = build_model(cfg.model, load_tokenizer(cfg.model, cfg.tokenizer), seed=cfg.seed)
    optimizer = make_optimizer(model, cfg)
    assert optimizer.defaults["foreach"] is None and optimizer.defaults["fused"] is None
    assert built_adamw(optimizer) == engine_optimizer("native", "cpu") == "for-loop"
    # what the dry run builds for each implementation
    assert built_adamw(make_optimizer(model, cfg, foreach=True)) == "foreach"
    assert built_adamw(make_optimizer(model, cfg, foreach=False, fused=True)) == "fused"


def test_torch_makes_the_temporaries_the_estimator_counts():
    """The lines of torch 2.13's AdamW that make (or do not make) a temporary, as the estimator counts them."""
    from torch.optim import adam

    multi = inspect.getsource(adam._multi_tensor_adam)
    assert "exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)" in multi  # as large as v
    single = inspect.getsource(adam._single_tensor_adam)
    assert "denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)" in single  # one parameter's, twice
    fused = inspect.getsource(adam._fused_adam)
    assert "torch._fused_adamw_" in fused and "_foreach_sqrt" not in fused and ".sqrt()" not in fused


def test_the_temporaries_of_each_step():
    shards = [2, 3, 10, 7]
    assert adamw_temporary_bytes("fused", shards, 4) == 0
    assert adamw_temporary_bytes("foreach", shards, 4) == 22 * 4  # sqrt(v) of every parameter at once
    # one parameter's square root and quotient beside the previous parameter's denominator, the largest such
    # triple: here 10 + 2 x 7 is more than 3 + 2 x 10
    assert adamw_temporary_bytes("for-loop", shards, 4) == (10 + 2 * 7) * 4
    assert adamw_temporary_bytes("for-loop", [], 4) == 0
    with pytest.raises(ConfigError, match="Unknown adamw 'sgd'"):
        adamw_temporary_bytes("sgd", shards, 4)
    # the optimizer's order: the embedding first, the decoder layers, the root's other parameters last
    config = resolve_model_config("smollm3-3b")
    st = sharded_state(config, RECIPES["hf-fsdp-bf16"], 2, 0, 2)
    assert st["optimizer_shards"][0] == config.vocab_size * config.hidden_size // 2
    assert st["optimizer_shards"][-1] == config.hidden_size // 2  # the final norm
    assert sum(st["optimizer_shards"]) * 2 * 4 == st["optimizer"]


def test_foreach_and_fused_differ_by_the_v_sized_temporary():
    """At the optimizer moment and nowhere else: foreach holds v's size more (half the AdamW state)."""
    for kw in ({"world_size": 2, "fsdp_version": 1}, {"world_size": 8, "lora": True}, {"world_size": 4}):
        fused, foreach = (estimate_memory("smollm3-3b", adamw=a, **kw) for a in ("fused", "foreach"))
        assert foreach.moments["optimizer"] - fused.moments["optimizer"] == fused.optimizer_bytes // 2
        assert {k: v for k, v in foreach.moments.items() if k != "optimizer"} == {
            k: v for k, v in fused.moments.items() if k != "optimizer"
        }
        assert (fused.adamw, foreach.adamw) == ("fused", "foreach")
    offload = estimate_memory("smollm3-3b", world_size=2, offload=True, adamw="foreach")
    assert offload.moments["optimizer"] == estimate_memory("smollm3-3b", world_size=2, offload=True,
                                                           adamw="fused").moments["optimizer"]  # fmt: skip


def test_every_committed_dry_run_row_names_the_adamw_it_traced():
    """The committed grids were traced with the native step's foreach AdamW: each row says so."""
    import json

    from smolfsdp.paths import repo_root

    for name in ("grid", "shapes"):
        runs = json.loads((repo_root() / f"data/results/dryrun/{name}.json").read_text())["runs"]
        assert {traced_adamw(r["setup"]) for r in runs} == {"foreach"}, name
    assert traced_adamw({"optimizer": adamw_step.OPTIMIZER_TEXT["fused"]}) == "fused"
    with pytest.raises(ConfigError, match="is not one of"):
        traced_adamw({"optimizer": "torch.optim.SGD()"})
