"""LoRA + FSDP2 (and FSDP1): sharding facts, trainable set, tied embeddings, adapter export, resume."""

import pytest
import torch
from _dist import run_distributed

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch import runner
from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding.lora import apply_lora, check_trainable_dtypes, load_adapter_model

LORA = TrainConfig(lora=True, fsdp_version=2)


def _expected_lora_params(model, r, targets):
    n = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            n += r * (m.in_features + m.out_features)
    return n


def test_only_lora_parameters_train(tokenizer):
    base = build_model("tiny", tokenizer)
    expected = _expected_lora_params(base, 8, LORA.lora_target_modules)
    model = apply_lora(base, LORA)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert sum(p.numel() for p in trainable.values()) == expected
    from smolfsdp.estimate.params import LoraSpec
    from smolfsdp.estimate.params import count_parameters as estimated_counts

    est = estimated_counts(base.config, LoraSpec(r=8, alpha=16, targets=tuple(LORA.lora_target_modules)))
    assert est.trainable == expected  # the memory model counts the same adapters
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


def test_lora_count_for_smollm3_3b_geometry():
    """r=8 on q/k/v/o of SmolLM3-3B: 3,833,856 trainable parameters (from its config, on meta)."""
    from transformers import AutoModelForCausalLM, SmolLM3Config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(SmolLM3Config())
    assert _expected_lora_params(model, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]) == 3_833_856


def test_target_modules_that_match_nothing(tokenizer):
    with pytest.raises(ConfigError, match=r"match no linear layer.*\['down_proj', 'gate_proj'"):
        apply_lora(build_model("tiny", tokenizer), TrainConfig(lora=True, lora_target_modules=["qkv_proj"]))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"lora_r": 0}, "positive integer"),
        ({"fsdp_version": 1, "use_orig_params": False}, "needs use_orig_params=true"),
        ({"engine": "trl"}, "native engine"),
    ],
)
def test_lora_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(lora=True, **kw)


def test_mixed_trainable_dtypes_in_one_group_are_named(tokenizer):
    model = apply_lora(build_model("tiny", tokenizer), LORA)
    layer0 = model.base_model.model.model.layers[0].self_attn.q_proj
    layer0.lora_A["default"].to(torch.bfloat16)
    with pytest.raises(ConfigError, match=r"layers\.0 mixes trainable dtypes.*bfloat16.*float32"):
        check_trainable_dtypes(model)


def test_pinned_offload_without_cuda_is_refused():
    from smolfsdp.sharding.fsdp2 import make_offload_policy

    assert make_offload_policy().pin_memory is False  # CPU-only machine: unpinned
    with pytest.raises(ConfigError, match="needs CUDA"):
        make_offload_policy(pin_memory=True)


def _sharding_facts(rank, world, vocab_size):
    """FSDP2 on the tiny model (odd vocabulary) after one LoRA-free step: placements, halves, ties."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh, describe_sharding, fsdp_units
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0, vocab_size=vocab_size)
    wrap = resolve_wrap_class(model)
    n_layers = model.config.num_hidden_layers
    apply_fsdp2(model, build_mesh("cpu", world), wrap)
    table = describe_sharding(model)
    emb = model.model.embed_tokens.weight
    before = emb.to_local().detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
        [{"input_ids": [1, 5, 9, 7, 2], "labels": [-100, 5, 9, 7, 2]}]
    )
    forward_backward(model, [batch], world, torch.device("cpu"))
    opt.step()
    after = model.model.embed_tokens.weight.to_local()
    dist.barrier()
    return {
        "all_dtensor_shard0": all(
            isinstance(p, DTensor) and p.placements == (Shard(0),) for p in model.parameters()
        ),
        "rows": table[["name", "local_shape", "global_shape"]].values.tolist(),
        "units": len(fsdp_units(model)),
        "n_layers": n_layers,
        "every_row_changed": bool((after != before).any(dim=1).all()),
        "local_rows": after.shape[0],
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
    }


def test_fsdp2_sharding_facts_with_odd_vocabulary():
    res = run_distributed(_sharding_facts, 2, 1025)
    for r in res:
        assert r["all_dtensor_shard0"]
        assert r["units"] == r["n_layers"] + 1
        assert r["tied"] and r["every_row_changed"]
        for name, local, full in r["rows"]:
            # Shard(0): rank 0 holds ceil(dim0/2) rows, rank 1 the rest: half within one row
            assert abs(local[0] - full[0] / 2) <= 0.5 and local[1:] == full[1:], name
    assert res[0]["local_rows"] + res[1]["local_rows"] == 1025 and res[0]["local_rows"] == 513


def _adapter_roundtrip(rank, world, out_dir):
    """Train one LoRA step under FSDP2, save the adapter, compare with live tensors and logits."""
    from pathlib import Path

    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.sharding import lora as lora_module
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh
    from smolfsdp.sharding.lora import save_adapter
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    model = apply_lora(build_model("tiny", tok, seed=0), LORA.replace(lora_dropout=0.0))
    apply_fsdp2(model, build_mesh("cpu", world), resolve_wrap_class(model))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    collate = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)
    for _ in range(2):
        forward_backward(
            model,
            [collate([{"input_ids": [1, 5, 9, 7, 2], "labels": [-100, 5, 9, 7, 2]}])],
            world,
            torch.device("cpu"),
        )
        opt.step()
        opt.zero_grad()
    live = {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    model.eval()
    probe = collate([{"input_ids": [1, 40, 41, 42, 43, 2], "labels": [-100] * 6}])
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    gathered, asked = [], []  # what the export gathers: each full_tensor() and each state-dict request
    full_tensor, state_dict = DTensor.full_tensor, lora_module.get_model_state_dict

    def counting_full_tensor(self, *args, **kwargs):
        out = full_tensor(self, *args, **kwargs)
        gathered.append(out.numel() * out.element_size())
        return out

    def recording_state_dict(m, *args, options=None, **kwargs):
        asked.append(options.full_state_dict)
        return state_dict(m, *args, options=options, **kwargs)

    DTensor.full_tensor, lora_module.get_model_state_dict = counting_full_tensor, recording_state_dict
    try:
        save_adapter(model, Path(out_dir), info, LORA, tok)
    finally:
        DTensor.full_tensor, lora_module.get_model_state_dict = full_tensor, state_dict
    if rank != 0:
        return None
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    saved = load_file(str(Path(out_dir) / "adapter" / "adapter_model.safetensors"))
    reloaded = load_adapter_model("tiny", Path(out_dir) / "adapter", tok, seed=0)
    with torch.no_grad():
        re_logits = reloaded(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    return {"live": live, "saved": saved, "logits": logits, "re_logits": re_logits, "gathered": gathered,
            "asked_full": asked, "model_bytes": model_bytes}  # fmt: skip


def test_saved_adapter_is_full_and_reloads(tmp_path):
    r = run_distributed(_adapter_roundtrip, 2, str(tmp_path))[0]
    assert len(r["saved"]) == len(r["live"]) > 0
    for name, tensor in r["live"].items():
        key = name.replace(".default", "")
        assert r["saved"][key].shape == tensor.shape  # full size, gathered from both ranks
        torch.testing.assert_close(r["saved"][key], tensor)
    torch.testing.assert_close(r["re_logits"], r["logits"], rtol=1e-5, atol=1e-5)
    # only the adapters were gathered (one full_tensor each, their bytes), never a full state dict
    adapter_bytes = sum(t.numel() * t.element_size() for t in r["live"].values())
    assert r["asked_full"] == [False] and len(r["gathered"]) == len(r["live"])
    assert sum(r["gathered"]) == adapter_bytes < r["model_bytes"] / 10


@pytest.mark.parametrize("version", [2, 1])
def test_lora_run_learns(tmp_path, version):
    cfg = TrainConfig(
        name=f"lora{version}",
        output_dir=str(tmp_path),
        lora=True,
        fsdp_version=version,
        learning_rate=1e-2,
        num_train_epochs=2 if version == 2 else 0.5,
        eval_steps=10,
    )
    s = runner.run(cfg, capture=True, timeout=600).summary
    assert s["effective"]["strategy"] == f"fsdp{version}"
    assert s["params"]["trainable"] == 28_672  # 4 layers x r=8 x (q 128+128, k 128+64, v 128+64, o 128+128)
    assert s["adapter"]["tensors"] == 32
    if version == 2:
        assert s["metrics"]["eval_loss_last"] < s["metrics"]["eval_loss_first"] - 0.1


def test_resume_equals_uninterrupted(tmp_path):
    """Save at step 2, stop, resume, run to step 4 == an uninterrupted 4-step run."""
    from safetensors.torch import load_file

    base = TrainConfig(
        lora=True, fsdp_version=2, max_steps=4, eval_steps=0, learning_rate=1e-2, output_dir=str(tmp_path)
    )
    whole = runner.run(base.replace(name="whole"), capture=True, timeout=600).summary
    first = runner.run(
        base.replace(name="split", save_steps=2, stop_at_step=2), capture=True, timeout=600
    ).summary
    assert first["metrics"]["stopped_early"] and first["metrics"]["optimizer_step"] == 2
    second = runner.run(base.replace(name="split", resume_from="latest"), capture=True, timeout=600).summary
    assert second["metrics"]["resumed_from"].endswith("step-000002")
    assert second["metrics"]["optimizer_step"] == whole["metrics"]["optimizer_step"] == 4
    a = load_file(f"{whole['adapter']['adapter']}/adapter_model.safetensors")
    b = load_file(f"{second['adapter']['adapter']}/adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)


def test_resume_without_checkpoint_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        runner.preflight(TrainConfig(output_dir=str(tmp_path), resume_from="latest"))


def _eval_then_train(rank, world):
    """After an evaluation the FSDP2 model is sharded again (DTensor everywhere) and trains on."""
    from torch.distributed.tensor import DTensor
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.data.prepare import prepare_data
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh
    from smolfsdp.train.steps import evaluate, forward_backward

    tok = load_tokenizer("tiny")
    model = apply_lora(build_model("tiny", tok, seed=0), LORA)
    apply_fsdp2(model, build_mesh("cpu", world), resolve_wrap_class(model))
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    data = prepare_data(TrainConfig(max_rows=24), tok)
    collate = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    first = evaluate(model, data.eval, collate, 4, info)
    sharded = all(isinstance(p, DTensor) for p in model.parameters()) and model.training
    for i in range(3):
        forward_backward(model, [collate([data.train[2 * i + rank]])], world, info.device)
        opt.step()
        opt.zero_grad()
    return {
        "sharded_after_eval": sharded,
        "first": first,
        "second": evaluate(model, data.eval, collate, 4, info),
    }


def test_eval_leaves_model_sharded_and_training_goes_on():
    r = run_distributed(_eval_then_train, 2)[0]
    assert r["sharded_after_eval"]
    assert r["second"] != r["first"]  # the adapters moved after training resumed


def _mesh_too_large(rank, world):
    from smolfsdp.sharding.fsdp2 import build_mesh

    try:
        build_mesh("cpu", 4)
    except ConfigError as err:
        return str(err)
    return None


def test_mesh_larger_than_world_is_refused():
    msg = run_distributed(_mesh_too_large, 2)[0]
    assert msg is not None and "larger than the world size 2" in msg


PROMPTS = [list(range(3, 13)), list(range(40, 50))]  # one per rank: ranks generate different rows


def _lora_model(tok):
    """Tiny SmolLM3 with random LoRA B (peft's zero init would hide the adapters), in eval mode."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, target_modules=targets)
    return get_peft_model(build_model("tiny", tok, seed=0), config).eval()


def _sharded_generate(rank, world, version):
    from smolfsdp.sharding.lora import generate

    tok = load_tokenizer("tiny")
    model = _lora_model(tok)
    wrap = resolve_wrap_class(model)
    ids = torch.tensor([PROMPTS[rank]])
    if version == 2:
        from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh

        apply_fsdp2(model, build_mesh("cpu", world), wrap)
        with torch.no_grad():  # the call a reader makes; it raised "mixed torch.Tensor and DTensor"
            direct = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, synced_gpus=True)
    else:
        from smolfsdp.sharding.fsdp1 import wrap_fsdp1

        model = wrap_fsdp1(model, wrap)
        direct = None  # model.generate raises "'weight' must be 2-D": the root's hooks are bypassed
    helper = generate(model, input_ids=ids, max_new_tokens=6, do_sample=False)
    return {"direct": None if direct is None else direct.tolist(), "helper": helper.tolist()}


@pytest.mark.parametrize("version", [1, 2])
def test_generate_on_sharded_lora_equals_unsharded(tokenizer, version):
    reference = _lora_model(tokenizer)
    with torch.no_grad():
        expected = [
            reference.generate(input_ids=torch.tensor([p]), max_new_tokens=6, do_sample=False).tolist()
            for p in PROMPTS
        ]
    assert all(len(e[0]) == len(p) + 6 for e, p in zip(expected, PROMPTS, strict=True))
    for rank, got in enumerate(run_distributed(_sharded_generate, 2, version)):
        assert got["helper"] == expected[rank]
        if version == 2:
            assert got["direct"] == expected[rank]
