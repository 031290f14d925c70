"""The seed's headline path on 2 gloo ranks: TRL SFTTrainer + FSDP1 with the project's fsdp_config.

accelerate applies FSDP only on accelerators; ``smolfsdp.train.accelerate_cpu_fsdp`` lifts that gate, so
the Trainer shards for real on CPU. A DDP control run (gate left as shipped) trains the same steps.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.config import load_config
from smolfsdp.estimate.adamw_step import engine_optimizer
from smolfsdp.launch import runner
from smolfsdp.paths import recipe
from smolfsdp.train import accelerate_cpu_fsdp, trl_engine

# max_length 256 with the default too_long=drop: real padded batches, the longest rows dropped and counted
BASE = dict(max_steps=6, eval_steps=3, per_device_train_batch_size=2, max_length=256, save_total_limit=6)


@pytest.fixture(scope="module")
def fsdp_run(runs):
    cfg = load_config(recipe("smoke_trl"), name="fsdp", output_dir=str(runs), save_steps=3, **BASE)
    return runner.run(cfg, capture=True, timeout=600)


@pytest.fixture(scope="module")
def ddp_run(runs):
    cfg = load_config(
        recipe("smoke_trl"), name="ddp", output_dir=str(runs), accelerate_fsdp_on_cpu=False, **BASE
    )
    return runner.run(cfg, capture=True, timeout=600)


def test_the_trainer_applies_fsdp1_on_cpu(fsdp_run):
    s = fsdp_run.summary
    assert s["requested"]["strategy"] == "fsdp1" and s["effective"]["strategy"] == "fsdp1"
    assert "smolfsdp.train.accelerate_cpu_fsdp" in s["effective"]["reason"]
    ev = s["effective"]["evidence"]
    # 4 decoder layers + the root (embeddings, final norm; lm_head tied to embed_tokens)
    assert ev["fsdp_units"] == 5 and ev["flat_parameters"] == 5
    assert ev["wrapper"] == "FullyShardedDataParallel" and ev["parameter_type"] == "FlatParameter"
    assert ev["sharding_strategy"] == "FULL_SHARD"
    assert ev["accelerate_distributed_type"] == "DistributedType.FSDP"
    assert s["params"]["fraction_per_rank"] == [0.5, 0.5]
    assert sum(s["params"]["local_numel_per_rank"]) >= s["params"]["total"]  # padding only adds
    # issue 42: nothing asked, transformers' default attention ran (read from the model, not the config)
    assert s["run_options"]["attn_implementation"] == {"requested": None, "effective": "sdpa"}
    assert s["requested"]["fsdp_config"]["backward_prefetch"] == "BACKWARD_PRE"
    assert s["requested"]["fsdp_config"]["state_dict_type"] == "SHARDED_STATE_DICT"
    # the Trainer's default optim, a fused AdamW on CPU too: what the estimator models for the TRL engine
    assert s["optimizer"] == {"optim": "adamw_torch_fused", "adamw": engine_optimizer("trl", "cpu")} == {
        "optim": "adamw_torch_fused", "adamw": "fused"}  # fmt: skip


def test_the_gate_left_as_shipped_runs_ddp_and_says_so(ddp_run):
    s = ddp_run.summary
    assert s["effective"]["strategy"] == "ddp"
    assert "accelerate_fsdp_on_cpu is false" in s["effective"]["reason"]
    assert s["effective"]["evidence"]["wrapper"] == "DistributedDataParallel"
    assert s["params"]["fraction_per_rank"] == [1.0, 1.0]


def test_fsdp1_trains_like_the_ddp_control(fsdp_run, ddp_run):
    """Same data order, same steps: FSDP1's reduce-scatter and DDP's all-reduce sum the same gradients,
    only in another order, so losses and weights agree to float32 round-off."""
    a, b = fsdp_run.train.set_index("step"), ddp_run.train.set_index("step")
    assert list(a.index) == list(b.index) == [1, 2, 3, 4, 5, 6]
    for step in a.index:
        assert a.loc[step, "loss"] == pytest.approx(b.loc[step, "loss"], rel=1e-4)
        assert a.loc[step, "tokens"] == b.loc[step, "tokens"]
    assert list(fsdp_run.eval["eval_loss"]) == pytest.approx(list(ddp_run.eval["eval_loss"]), rel=1e-4)
    wa = load_file(f"{fsdp_run.summary['final_model']}/model.safetensors")
    wb = load_file(f"{ddp_run.summary['final_model']}/model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)


def test_checkpoints_convert_and_the_export_loads_tied(fsdp_run, tmp_path):
    from transformers import AutoModelForCausalLM

    ckpts = fsdp_run.path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000003", "step-000006"]
    for c in ckpts.iterdir():
        assert (c / checkpoint.MARKER).is_file() and {"__0_0.distcp", "__1_0.distcp"} <= {
            p.name for p in c.iterdir()
        }
    out = checkpoint.convert_checkpoint(ckpts / "step-000006", tmp_path / "converted")
    final = load_file(f"{fsdp_run.summary['final_model']}/model.safetensors")
    converted = load_file(str(out / "model.safetensors"))
    assert converted.keys() == final.keys()
    for k in final:
        torch.testing.assert_close(converted[k], final[k], rtol=0, atol=0)
    # the tied lm_head is stored once (as the native engine stores it) and re-tied on load
    assert "lm_head.weight" not in final
    model, info = AutoModelForCausalLM.from_pretrained(
        fsdp_run.summary["final_model"], output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.use_cache is True


def test_resume_from_a_mid_run_checkpoint_gives_the_uninterrupted_weights(fsdp_run, runs):
    cfg = load_config(recipe("smoke_trl"), name="stopped", output_dir=str(runs), save_steps=3, **BASE)
    first = runner.run(cfg.replace(stop_at_step=3), capture=True, timeout=600)
    assert first.summary["metrics"]["stopped_early"] and first.summary["final_model"] is None
    resumed = runner.run(cfg.replace(resume_from="latest"), capture=True, timeout=600)
    assert resumed.summary["effective"]["strategy"] == "fsdp1"
    assert resumed.summary["metrics"]["resumed_from"].endswith("step-000003")
    a = load_file(f"{fsdp_run.summary['final_model']}/model.safetensors")
    b = load_file(f"{resumed.summary['final_model']}/model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)


def test_the_full_recipe_runs_with_only_model_data_and_steps_swapped(runs, tokenizer):
    """configs/runs/smollm3_3b_medical.yaml as committed (bf16, FSDP activation checkpointing, 8
    accumulation steps, max_length 2048, reasoning), with a tiny SmolLM3 loaded through
    from_pretrained like the hub model, the bundled medical-o1 rows, 2 steps and 4 eval rows."""
    from smolfsdp.models.modeling import build_model
    from smolfsdp.paths import bundled_data_path

    local_model = runs / "tiny_pretrained"
    build_model("tiny", tokenizer).save_pretrained(local_model)
    tokenizer.save_pretrained(local_model)
    cfg = load_config(
        recipe("smollm3_3b_medical"),
        model=str(local_model),
        dataset=str(bundled_data_path()),
        max_steps=2,
        eval_size=4,
        output_dir=str(runs),
    )
    s = runner.run(cfg, capture=True, timeout=900).summary
    ev = s["effective"]["evidence"]
    assert s["effective"]["strategy"] == "fsdp1" and ev["fsdp_units"] == 5
    assert ev["activation_checkpoint_wrappers"] == 4  # one per decoder layer, applied by accelerate
    # bf16 compute, fp32 gradient reduction, fp32 buffers (RoPE inv_freq): smolfsdp.train.trl_engine.keep_fp32_buffers_and_reduce
    assert ev["mixed_precision"] == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "float32",
        "buffer_dtype": "float32",
    }
    assert s["params"]["fraction_per_rank"] == [0.5, 0.5]
    assert s["metrics"]["steps"] == 2 and s["data"]["eval_rows"] == 4
    config = json.loads((local_model / "config.json").read_text())
    assert (
        json.loads((runs / "smollm3_3b_medical" / "final_model" / "config.json").read_text())[
            "tie_word_embeddings"
        ]
        == config["tie_word_embeddings"]
    )


# ------------------------------------------------------------------ without launching processes
def test_the_gate_is_installed_and_removed_on_request():
    from accelerate.state import AcceleratorState

    original = AcceleratorState.__init__
    try:
        accelerate_cpu_fsdp.lift_cpu_fsdp_gate()
        assert accelerate_cpu_fsdp.is_lifted() and AcceleratorState.__init__ is not original
        accelerate_cpu_fsdp.lift_cpu_fsdp_gate()  # idempotent
    finally:
        accelerate_cpu_fsdp.restore_cpu_fsdp_gate()
    assert AcceleratorState.__init__ is original and not accelerate_cpu_fsdp.is_lifted()


def _plugin_as_accelerate_builds_it(args, mixed_precision: str):
    from accelerate.utils import FullyShardedDataParallelPlugin

    # sync_module_states makes the plugin look for a GPU at construction; it has no part in the policy
    plugin = FullyShardedDataParallelPlugin(**{**args.fsdp_plugin_args, "sync_module_states": False})
    plugin.set_mixed_precision(mixed_precision)  # what AcceleratorState.__init__ does with bf16=True
    return plugin.mixed_precision_policy


@pytest.fixture
def no_device_setup(monkeypatch):
    """TrainingArguments.__post_init__ sets up accelerate's PartialState (a process group for a 2-rank
    run); these tests only build the arguments, so the device is stubbed."""
    from transformers import TrainingArguments

    monkeypatch.setattr(TrainingArguments, "_setup_devices", property(lambda self: torch.device("cpu")))


@pytest.mark.parametrize("version", [1, 2])
def test_trainer_bf16_keeps_fp32_buffers_and_reduction(tmp_path, version, no_device_setup):
    """accelerate's own bf16 policy casts buffers (RoPE inv_freq) and the gradient reduction to bf16;
    the policy smolfsdp puts in the plugin's arguments survives accelerate's set_mixed_precision."""
    from smolfsdp.config import TrainConfig
    from smolfsdp.sharding.distributed import DistInfo

    # the arguments of a 2-GPU run (building them reads no device for fp32), then bf16 as the recipe asks
    gpu = DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cuda", 0), backend="nccl")
    cfg = TrainConfig(engine="trl", fsdp_version=version, output_dir=str(tmp_path))
    args = trl_engine.trl_args(cfg, gpu, str(tmp_path / "t"), "SmolLM3DecoderLayer")
    stock = _plugin_as_accelerate_builds_it(args, "bf16")
    assert stock.param_dtype == stock.reduce_dtype == torch.bfloat16  # accelerate as shipped
    if version == 1:
        assert stock.buffer_dtype == torch.bfloat16  # inv_freq in bf16: the defect
    trl_engine.keep_fp32_buffers_and_reduce(args, cfg.replace(mixed_precision="bf16"))
    mp = _plugin_as_accelerate_builds_it(args, "bf16")
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32
    if version == 1:
        assert mp.buffer_dtype == torch.float32
    else:
        assert mp.output_dtype is None  # FSDP2 returns outputs in the compute dtype (fsdp2.default_mp_policy)


def test_gradient_accumulation_syncs_each_micro_batch_unless_offloading(tmp_path, no_device_setup):
    """FSDP1 no_sync() would hold the whole unsharded gradient on every rank between micro-batches."""
    from smolfsdp.config import TrainConfig
    from smolfsdp.sharding.distributed import DistInfo

    gpu = DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cuda", 0), backend="nccl")

    def kwargs(**over):
        cfg = TrainConfig(engine="trl", output_dir=str(tmp_path))
        for key, value in over.items():  # set after validation: offload is refused on a CPU-only machine
            setattr(cfg, key, value)
        args = trl_engine.trl_args(cfg, gpu, str(tmp_path / "t"), "SmolLM3DecoderLayer")
        return args.accelerator_config.gradient_accumulation_kwargs

    assert kwargs(gradient_accumulation_steps=8) == {"sync_each_batch": True}
    assert not kwargs(gradient_accumulation_steps=1)
    assert not kwargs(gradient_accumulation_steps=8, cpu_offload=True)


def test_the_memory_estimate_counts_what_no_sync_holds(tmp_path):
    """Offload + accumulation keeps FSDP1 no_sync(): the estimate adds the whole unsharded gradient."""
    from smolfsdp.config import TrainConfig
    from smolfsdp.estimate.memory import estimate_memory
    from smolfsdp.estimate.params import count_parameters, resolve_model_config

    cfg = TrainConfig(engine="trl", gradient_accumulation_steps=8, output_dir=str(tmp_path))
    assert not trl_engine.accumulates_under_no_sync(cfg)
    cfg.cpu_offload = True  # set after validation: offload is refused on a CPU-only machine
    assert trl_engine.accumulates_under_no_sync(cfg)
    kw = dict(world_size=2, fsdp_version=1, offload=True, seq_len=2048, micro_batch=2)
    synced, held = estimate_memory(**kw), estimate_memory(**kw, no_sync=True)
    trainable = count_parameters(resolve_model_config("smollm3-3b")).trainable
    assert synced.no_sync_grads_bytes == 0
    assert held.no_sync_grads_bytes == trainable * 2 == 3_075_098_624 * 2  # bf16, every parameter
    assert held.peak_bytes - synced.peak_bytes == held.no_sync_grads_bytes
    assert held.components()["no_sync_grads"] == held.no_sync_grads_bytes


def test_chapter_01s_checklist_names_keys_the_run_writes(fsdp_run):
    """Every key chapter 01 tells a reader to check in summary.json exists in a TRL run's file, and the peak
    memory record has the fields it names (None on CPU: no CUDA allocator)."""
    from smolfsdp.book.two_gpu_run import SUMMARY_CHECKS, lookup

    summary = json.loads((fsdp_run.path / "summary.json").read_text())
    for path, _ in SUMMARY_CHECKS:
        lookup(summary, path)
    assert lookup(summary, "effective.reason")
    peaks = summary["peak_memory_per_rank"]
    assert len(peaks) == summary["world_size"] == 2
    for peak in peaks:
        assert peak["device"] == "cpu" and peak["rss_peak_bytes"] > 0
        assert peak["max_memory_allocated_bytes"] is None and peak["max_memory_reserved_bytes"] is None
    assert {"torch", "transformers", "trl", "peft", "accelerate"} <= set(summary["versions"])
