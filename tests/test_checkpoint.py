"""Sharded DCP checkpoints: atomic saves, keep-last-K, disk checks, kill + resume, convert."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from _dist import kill_run_when, run_distributed
from safetensors.torch import load_file

from smolfsdp import checkpoint, sft
from smolfsdp.config import ConfigError, TrainConfig

BASE = TrainConfig(
    max_steps=6, eval_steps=0, per_device_train_batch_size=2, max_length=128, too_long="truncate"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def uninterrupted(runs):
    return sft.run(BASE.replace(name="whole", output_dir=str(runs)), capture=True, timeout=600)


def _failing_second_save(rank, world, run_dir):
    """Save at step 1, then a save that dies after writing part of its shards."""
    from smolfsdp.fsdp2 import apply_fsdp2, build_mesh
    from smolfsdp.modeling import build_model, load_tokenizer, resolve_wrap_class

    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    apply_fsdp2(model, build_mesh("cpu", world), resolve_wrap_class(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    checkpoint.save_checkpoint(run_dir, 1, model, opt, sched, {"epoch": 0, "consumed": 1}, rank)
    real_save = checkpoint.dcp.save

    def dying_save(state, checkpoint_id):
        Path(checkpoint_id, f"__{rank}_0.distcp").write_bytes(b"partial")  # a torn write
        raise OSError(28, "No space left on device (injected)")

    checkpoint.dcp.save = dying_save
    try:
        checkpoint.save_checkpoint(run_dir, 2, model, opt, sched, {"epoch": 0, "consumed": 2}, rank)
        failed = None
    except OSError as err:
        failed = str(err)
    finally:
        checkpoint.dcp.save = real_save
    return {"failed": failed, "latest": str(checkpoint.latest_checkpoint(run_dir))}


def test_failed_save_leaves_previous_checkpoint(tmp_path):
    res = run_distributed(_failing_second_save, 2, str(tmp_path))
    assert all("injected" in r["failed"] for r in res)
    assert res[0]["latest"].endswith("step-000001")
    torn = tmp_path / "checkpoints" / "step-000002.tmp"
    assert torn.is_dir() and not checkpoint.is_complete(torn)
    assert not (tmp_path / "checkpoints" / "step-000002").exists()
    with pytest.raises(ConfigError, match="not a complete"):
        checkpoint.resolve_resume(str(torn), tmp_path)


def test_keep_last_k_and_convert(uninterrupted, runs, tmp_path):
    cfg = BASE.replace(name="kept", output_dir=str(runs), save_steps=2, save_total_limit=2)
    run = sft.run(cfg, capture=True, timeout=600)
    kept = sorted(p.name for p in (run.path / "checkpoints").iterdir())
    assert kept == ["step-000004", "step-000006"]
    out = checkpoint.convert_checkpoint(run.path / "checkpoints" / "step-000006", tmp_path / "converted")
    converted = load_file(str(out / "model.safetensors"))
    final = load_file(str(run.path / "final_model" / "model.safetensors"))
    assert converted.keys() == final.keys()
    for k in final:
        assert converted[k].shape == final[k].shape
        torch.testing.assert_close(converted[k], final[k], rtol=0, atol=0)
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 40, 41, 42, 2]])
    a = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    b = AutoModelForCausalLM.from_pretrained(run.path / "final_model").eval()(ids).logits
    torch.testing.assert_close(a, b)
    with pytest.raises(ConfigError, match="exists and is not empty"):
        checkpoint.convert_checkpoint(run.path / "checkpoints" / "step-000006", tmp_path / "converted")
    checkpoint.convert_checkpoint(
        run.path / "checkpoints" / "step-000006", tmp_path / "converted", overwrite=True
    )


def test_convert_refuses_bad_checkpoints(uninterrupted, runs, tmp_path):
    with pytest.raises(ConfigError, match="not a DCP checkpoint"):
        checkpoint.convert_checkpoint(uninterrupted.path, tmp_path / "x")
    src = runs / "kept" / "checkpoints" / "step-000006"
    if not src.exists():
        pytest.skip("needs test_keep_last_k_and_convert's run")
    incomplete = tmp_path / "r" / "checkpoints" / "step-000006"
    shutil.copytree(src, incomplete)
    (incomplete / checkpoint.MARKER).unlink()
    with pytest.raises(ConfigError, match="incomplete"):
        checkpoint.convert_checkpoint(incomplete, tmp_path / "y")
    other = tmp_path / "other" / "checkpoints" / "step-000006"
    shutil.copytree(src, other)
    BASE.replace(lora=True, fsdp_version=2).save(other.parent.parent / "config.yaml")  # another model
    BASE.replace(lora=True, fsdp_version=2).save(other / "config.yaml")
    with pytest.raises(ConfigError, match=r"does not match the model.*missing: \['base_model"):
        checkpoint.convert_checkpoint(other, tmp_path / "z")


def test_kill_after_step_3_of_6_then_resume(uninterrupted, runs):
    """SIGKILL every rank once step 3's checkpoint is complete; resume; same result as uninterrupted."""
    cfg = BASE.replace(name="killed", output_dir=str(runs), save_steps=1, save_total_limit=6)
    marker = runs / "killed" / "checkpoints" / "step-000003" / checkpoint.MARKER
    returncode = kill_run_when(cfg, marker)
    assert returncode != 0, "the run finished before it could be killed"
    latest = checkpoint.latest_checkpoint(runs / "killed")
    assert latest is not None and 3 <= int(latest.name.split("-")[1]) < 6
    assert not (runs / "killed" / "final_model").exists()
    resumed = sft.run(cfg.replace(resume_from="latest"), capture=True, timeout=600).summary
    assert resumed["metrics"]["resumed_from"] == str(latest)
    assert resumed["metrics"]["optimizer_step"] == uninterrupted.summary["metrics"]["optimizer_step"] == 6
    a = load_file(f"{uninterrupted.summary['final_model']}/model.safetensors")
    b = load_file(f"{resumed['final_model']}/model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)


def test_disk_too_small_is_refused_before_training(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        cfg = BASE.replace(name="nospace", output_dir=str(mnt), save_steps=2)
        with pytest.raises(checkpoint.DiskSpaceError) as err:
            sft.preflight(cfg)
        msg = str(err.value)
        needed = sft.bytes_to_write(
            cfg,
            __import__("smolfsdp.modeling").modeling.build_meta_model(
                "tiny", __import__("smolfsdp.modeling").modeling.load_tokenizer("tiny")
            ),
        )
        assert f"{needed:,} bytes" in msg and "bytes free" in msg
        assert not any(mnt.iterdir())  # nothing was started or written
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_checkpoint_size_estimate_matches_disk(runs):
    """The estimate used by the disk check against the bytes a real checkpoint took."""
    from smolfsdp.modeling import build_meta_model, load_tokenizer

    ckpt = runs / "kept" / "checkpoints" / "step-000006"
    if not ckpt.exists():
        pytest.skip("needs test_keep_last_k_and_convert's run")
    on_disk = sum(f.stat().st_size for f in ckpt.iterdir() if f.suffix == ".distcp")
    est = checkpoint.estimate_checkpoint_bytes(build_meta_model("tiny", load_tokenizer("tiny")))
    assert on_disk <= est <= on_disk * 1.05


def test_resume_into_another_model_is_refused_before_launch(runs):
    if not (runs / "kept" / "checkpoints").exists():
        pytest.skip("needs test_keep_last_k_and_convert's run")
    cfg = BASE.replace(name="kept", output_dir=str(runs), lora=True, fsdp_version=2, resume_from="latest")
    before = (runs / "kept" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"does not match.*missing: \['base_model"):
        sft.preflight(cfg)
    assert (runs / "kept" / "config.yaml").read_text() == before  # nothing launched, nothing rewritten
