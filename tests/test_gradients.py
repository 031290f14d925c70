"""One step on 2 FSDP ranks gives the gradients of one process on the full batch (fp32).

Rows keep their own lengths (``max_length`` above every row), so every micro-batch is right-padded
as the native engine pads it (TRL's ``DataCollatorForLanguageModeling``): padding is what broke activation checkpointing while the model's
config kept ``use_cache=True`` (the recompute appended keys and values a second time).
"""

import pytest
import torch
from _dist import run_distributed
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from smolfsdp.config import TrainConfig
from smolfsdp.data.prepare import prepare_data
from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.train.steps import forward_backward

N_ROWS = 4
MAX_LENGTH = 512  # above every bundled row of the first 4: lengths 180-234 tokens, all different


def _rows(tok):
    # uneven lengths on purpose: each rank pads differently and holds a different number of label tokens
    data = prepare_data(TrainConfig(eval_size=0, max_rows=N_ROWS, max_length=MAX_LENGTH), tok)
    rows = [data.train[i] for i in range(N_ROWS)]
    assert len({len(r["input_ids"]) for r in rows}) == N_ROWS  # no row truncated to a common length
    return rows


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _model(tok, lora: bool):
    model = build_model("tiny", tok, seed=0)
    if lora:  # B initialised randomly (not peft's zero), so every adapter gradient is non-trivial
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=4,
                lora_alpha=8,
                lora_dropout=0.0,
                init_lora_weights=False,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
        )
    return model


def _sharded_grads(rank, world, version, lora=False, ac=False, accum=False):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from smolfsdp.sharding.distributed import DistInfo

    tok = load_tokenizer("tiny")
    rows = _rows(tok)
    model = _model(tok, lora)
    wrap = resolve_wrap_class(model)
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    if ac:  # the native engine's own sharding: FSDP + activation checkpointing as a run applies them
        from smolfsdp.train.native import shard_model

        cfg = TrainConfig(fsdp_version=version, activation_checkpointing=True, lora=lora, nproc=world)
        model, _ = shard_model(model, cfg, info)
    elif version == 1:
        from smolfsdp.sharding.fsdp1 import wrap_fsdp1

        model = wrap_fsdp1(model, wrap, device=info.device)
    else:
        from torch.distributed.device_mesh import init_device_mesh

        from smolfsdp.sharding.fsdp2 import apply_fsdp2

        apply_fsdp2(model, init_device_mesh("cpu", (world,)), wrap)
    per_rank = N_ROWS // world
    local = rows[rank * per_rank : (rank + 1) * per_rank]
    collate = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)
    micro = [collate([row]) for row in local] if accum else [collate(local)]  # accumulation: 1 row per micro
    loss, n_items = forward_backward(model, micro, world, info.device)
    grads = {}
    if version == 1:
        with FSDP.summon_full_params(model, with_grads=True):
            for n, p in model.named_parameters():
                if p.requires_grad:
                    grads[_clean(n)] = p.grad.detach().clone()
    else:
        for n, p in model.named_parameters():
            if p.requires_grad:
                grads[_clean(n)] = p.grad.full_tensor().detach().clone()
    dist.barrier()
    return {"loss": loss, "n_items": n_items, "grads": grads}


def _reference(lora: bool):
    tok = load_tokenizer("tiny")
    rows = _rows(tok)
    model = _model(tok, lora)
    out = model(**DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(rows))
    out.loss.backward()
    return {
        "loss": out.loss.item(),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad},
    }


@pytest.mark.parametrize(
    "version,lora,ac,accum",
    [
        (1, False, False, False),
        (2, False, False, False),
        (1, True, False, False),
        (2, True, False, False),
        (1, False, True, False),
        (2, False, True, False),
        (1, True, True, False),
        (2, True, True, False),
        (1, False, False, True),
    ],
    ids=[
        "fsdp1",
        "fsdp2",
        "fsdp1-lora",
        "fsdp2-lora",
        "fsdp1-activation-checkpointing",
        "fsdp2-activation-checkpointing",
        "fsdp1-lora-activation-checkpointing",
        "fsdp2-lora-activation-checkpointing",
        "fsdp1-grad-accumulation",
    ],
)
def test_two_rank_gradients_equal_single_process(version, lora, ac, accum):
    reference = _reference(lora)
    results = run_distributed(_sharded_grads, 2, version, lora, ac, accum)
    r0 = results[0]
    assert r0["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert set(r0["grads"]) == set(reference["grads"]) and len(r0["grads"]) > 0
    assert all(g.abs().sum() > 0 for g in reference["grads"].values())  # no trivially-zero gradient
    for name, ref in reference["grads"].items():
        got = r0["grads"][name]
        assert got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert results[1]["loss"] == pytest.approx(r0["loss"])  # every rank reports the global loss
