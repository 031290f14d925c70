"""The run options a TRL user expects (issue 42): ``attn_implementation``, ``torch_compile``, ``use_liger_kernel``.

Field checks (``smolfsdp.run_options.check_kernels``), the machine's checks before launch
(``smolfsdp.launch.kernel_checks``, with this machine's answers replaced where a GPU or a package is needed),
what each engine hands on (``smolfsdp.train.speedups``), and a 2-rank CPU step of the native engine whose compiled
decoder layers give the eager loss and gradient norm (FSDP1 and FSDP2).
"""

import pytest
import torch
from _dist import run_distributed

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch.kernel_checks import check_kernels_here, installed
from smolfsdp.launch.validate import validate
from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.train.speedups import LIGER_CONFIG, run_options_record

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


# ------------------------------------------------------------------ the fields alone
@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"attn_implementation": "flash_attn_2"}, "Did you mean 'flash_attention_2'"),
        ({"attn_implementation": "flash_attention_2"}, "set mixed_precision: bf16"),
        ({"torch_compile": True, "use_orig_params": False}, "needs use_orig_params: true"),
    ],
)
def test_fields_refused_in_one_line(fields, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        TrainConfig(**fields)
    assert "\n" not in str(err.value)


def test_fields_accepted():
    assert TrainConfig(attn_implementation="flash_attention_2", mixed_precision="bf16").attn_implementation
    assert TrainConfig(attn_implementation="kernels-community/flash-attn2").attn_implementation
    # the Trainer's FSDP1 always sets use_orig_params, so the field does not stop the TRL engine compiling
    assert TrainConfig(engine="trl", torch_compile=True, use_orig_params=False).torch_compile
    assert TrainConfig(fsdp_version=2, torch_compile=True, use_orig_params=False).torch_compile


# ------------------------------------------------------------------ the machine, before launch
def _has(*names):
    return lambda dist: dist in names


FLASH = {"attn_implementation": "flash_attention_2", "mixed_precision": "bf16"}


@pytest.mark.parametrize(
    ("fields", "gpus", "has", "needle"),
    [
        (FLASH, 0, _has("flash-attn"), "runs on CUDA GPUs only"),
        (FLASH, 2, _has(), "needs the flash-attn package"),
        ({**FLASH, "attn_implementation": "flash_attention_3"}, 2, _has("flash-attn"), "flash-attn-3"),
        ({"attn_implementation": "kernels-community/flash-attn2"}, 2, _has(), "pip install kernels"),
        ({"use_liger_kernel": True}, 0, _has("liger-kernel"), "Triton GPU kernels"),
        ({"use_liger_kernel": True}, 2, _has(), "pip install liger-kernel"),
    ],
)
def test_what_this_machine_lacks_is_refused_in_one_line(fields, gpus, has, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        check_kernels_here(TrainConfig(**fields), gpu_count=gpus, has=has)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("fields", "has"),
    [
        (FLASH, _has("flash-attn")),
        (FLASH, _has("kernels")),  # transformers falls back to the Hub's flash-attention kernel
        ({"attn_implementation": "kernels-community/flash-attn2"}, _has("kernels")),
        ({"use_liger_kernel": True}, _has("liger-kernel")),
        ({"attn_implementation": "sdpa", "torch_compile": True}, _has()),
    ],
)
def test_what_this_machine_has_passes(fields, has):
    check_kernels_here(TrainConfig(**fields), gpu_count=2, has=has, toolchain_missing=list)


def test_compile_needs_a_compiler():
    cfg = TrainConfig(torch_compile=True)
    with pytest.raises(ConfigError, match=r"lacks a C\+\+ compiler"):
        check_kernels_here(cfg, gpu_count=0, cxx_missing=lambda: True)
    with pytest.raises(ConfigError, match="lacks the triton module"):
        check_kernels_here(cfg, gpu_count=2, toolchain_missing=lambda: ["the triton module"])
    check_kernels_here(cfg, gpu_count=0, cxx_missing=lambda: False)


def test_installed_reads_distribution_metadata():
    assert installed("torch") and installed("trl")
    assert not installed("no-such-distribution-smolfsdp")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a machine without a GPU gives")
def test_validate_refuses_gpu_only_options_here():
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        validate(TrainConfig(use_liger_kernel=True))
    with pytest.raises(ConfigError, match="CUDA GPUs only"):
        validate(TrainConfig(**FLASH))
    assert validate(TrainConfig(attn_implementation="eager")).attn_implementation == "eager"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a machine without a GPU gives")
def test_train_command_refuses_before_any_rank_starts(tmp_path):
    import subprocess
    import sys

    args = ["train", "--use_liger_kernel", "true", "--output_dir", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, "-m", "smolfsdp.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "use_liger_kernel: Liger's kernels are Triton GPU kernels" in out.stderr
    assert not any(tmp_path.iterdir())  # refused before a run folder or a rank


# ------------------------------------------------------------------ what the engines hand on
def test_build_model_uses_the_attention_asked_for_and_the_record_reads_it(tokenizer):
    eager = build_model("tiny", tokenizer, attn_implementation="eager")
    default = build_model("tiny", tokenizer)
    assert eager.config._attn_implementation == "eager"
    assert default.config._attn_implementation == "sdpa"  # transformers 5.x's default where supported
    record = run_options_record(TrainConfig(attn_implementation="eager"), eager, compiled_layers=None)
    assert record["attn_implementation"] == {"requested": "eager", "effective": "eager"}
    assert run_options_record(TrainConfig(), default, 4)["attn_implementation"] == {
        "requested": None, "effective": "sdpa"}  # fmt: skip
    assert run_options_record(TrainConfig(torch_compile=True), default, 4)["torch_compile"] == {
        "requested": True, "compiled_layers": 4, "compiled_model": False}  # fmt: skip
    whole = torch.compile(default)  # what accelerate hands the Trainer with torch_compile (not run here)
    assert run_options_record(TrainConfig(engine="trl", torch_compile=True), default, wrapped=whole)[
        "torch_compile"] == {"requested": True, "compiled_layers": None, "compiled_model": True}  # fmt: skip


def test_trl_engine_passes_compile_and_liger_to_the_trainer(tmp_path):
    from smolfsdp.train.trl_engine import trl_args

    off = trl_args(TrainConfig(engine="trl"), CPU, str(tmp_path / "a"), "SmolLM3DecoderLayer")
    assert (off.torch_compile, off.use_liger_kernel) == (False, False)
    on = TrainConfig(engine="trl", torch_compile=True, use_liger_kernel=True)
    args = trl_args(on, CPU, str(tmp_path / "b"), "SmolLM3DecoderLayer")
    assert args.torch_compile and args.torch_compile_backend == "inductor"
    assert args.use_liger_kernel and args.liger_kernel_config == LIGER_CONFIG
    assert LIGER_CONFIG["fused_linear_cross_entropy"] is False  # TRL 1.16 refuses it: it patches the LM head


# ------------------------------------------------------------------ compiled layers train as eager ones
def _steps(rank, world, version):
    """Two optimizer steps of the native engine's sharding and step on one fixed batch, eager then compiled;
    returns ``{compile: (losses, grad norms, compiled layers)}``."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.data.prepare import prepare_data
    from smolfsdp.train.native import make_optimizer
    from smolfsdp.train.native_sharding import shard_model
    from smolfsdp.train.speedups import apply_torch_compile
    from smolfsdp.train.steps import clip_grad_norm, forward_backward

    tok = load_tokenizer("tiny")
    rows = prepare_data(TrainConfig(eval_size=0, max_rows=8, max_length=256), tok).train
    collate = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)
    mine = [rows[i] for i in range(rank * 4, rank * 4 + 4)]
    batches = [collate(mine)] * 2  # one fixed batch, twice: the second step's loss must be lower
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = {}
    for compiled in (False, True):
        cfg = TrainConfig(fsdp_version=version, torch_compile=compiled, nproc=world)
        model = build_model("tiny", tok, seed=0)
        wrap_cls = resolve_wrap_class(model)
        model, _ = shard_model(model, cfg, info)
        compiled_layers = apply_torch_compile(model, cfg, wrap_cls)  # as NativeTrainer does, after sharding
        optimizer = make_optimizer(model, cfg)
        losses, norms = [], []
        for batch in batches:
            loss, _ = forward_backward(model, [batch], world, info.device)
            norms.append(clip_grad_norm(model, cfg.max_grad_norm, version))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
        out[compiled] = (losses, norms, compiled_layers)
    return out


# inductor compiles C++ for the CPU at the first step: ~1.5 min per FSDP version on a cold cache and a busy 2-core
# machine, so FSDP2 (torchtitan's path) runs by default and FSDP1 (use_orig_params=True) with the slow tests
@pytest.mark.parametrize("version", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_compiled_decoder_layers_train_like_eager_ones(version):
    rank0 = run_distributed(_steps, 2, version, timeout=600)[0]
    eager, compiled = rank0[False], rank0[True]
    assert eager[2] is None and compiled[2] == 4  # the tiny preset's 4 decoder layers, compiled in place
    assert eager[0][1] < eager[0][0]  # it trains: the second step's loss is lower
    assert compiled[0] == pytest.approx(eager[0], abs=1e-5)
    assert compiled[1] == pytest.approx(eager[1], rel=1e-4)


@pytest.mark.slow  # accelerate compiles the whole FSDP1-wrapped model: ~3 min on a 2-core CPU, cold cache
def test_trl_engine_compiles_through_the_trainer_and_trains_like_eager(runs):
    from smolfsdp.config import load_config
    from smolfsdp.launch import runner
    from smolfsdp.paths import recipe

    base = dict(output_dir=str(runs), max_steps=2, eval_steps=0)
    eager = runner.run(load_config(recipe("smoke_trl"), name="trl_eager", **base), capture=True, timeout=900)
    compiled = runner.run(
        load_config(recipe("smoke_trl"), name="trl_compiled", torch_compile=True, **base),
        capture=True,
        timeout=900,
    )
    said = compiled.summary["run_options"]["torch_compile"]
    assert said == {"requested": True, "compiled_layers": None, "compiled_model": True}
    assert eager.summary["run_options"]["torch_compile"]["compiled_model"] is False
    m, e = compiled.summary["metrics"], eager.summary["metrics"]
    assert m["train_loss_last"] == pytest.approx(e["train_loss_last"], abs=1e-5)
    assert m["eval_loss_last"] == pytest.approx(e["eval_loss_last"], abs=1e-5)
