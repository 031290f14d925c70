"""Sharded DCP checkpoints: atomic saves, keep-last-K, disk checks, kill + resume, convert, verification."""

import gc
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from _dist import run_distributed
from safetensors.torch import load_file

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.checkpoint import disk as checkpoint_disk
from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch import failures, runner
from smolfsdp.models.modeling import build_meta_model, load_tokenizer
from smolfsdp.probes import drills

BASE = TrainConfig(
    max_steps=6, eval_steps=0, per_device_train_batch_size=2, max_length=128, too_long="truncate"
)


def _failing_second_save(rank, world, run_dir):
    """Save at step 1, then a save that dies after writing part of its shards."""
    from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh

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
    except checkpoint.DiskFullError as err:
        failed = str(err)
    finally:
        checkpoint.dcp.save = real_save
    return {"failed": failed, "latest": str(checkpoint.latest_checkpoint(run_dir))}


def test_failed_save_leaves_previous_checkpoint(tmp_path):
    res = run_distributed(_failing_second_save, 2, str(tmp_path))
    assert all("injected" in r["failed"] for r in res)
    assert res[0]["latest"].endswith("step-000001")
    # a full disk is named: the filesystem, the bytes needed and free, the last good checkpoint
    good = tmp_path / "checkpoints" / "step-000001"
    size = sum(f.stat().st_size for f in good.iterdir())
    for r in res:
        assert "ran out of disk space ([Errno 28] No space left on device (injected))" in r["failed"]
        assert f"on the filesystem mounted at {checkpoint_disk._mount_point(tmp_path)}:" in r["failed"]
        assert f"needs about {size:,} bytes (the size of step-000001)" in r["failed"]
        assert " bytes are free with the partial save " in r["failed"]
        assert f"The last good checkpoint is {good}; once there is room, resume from it" in r["failed"]
    torn = tmp_path / "checkpoints" / "step-000002.tmp"
    assert torn.is_dir() and not checkpoint.is_complete(torn)
    assert not (tmp_path / "checkpoints" / "step-000002").exists()
    with pytest.raises(ConfigError, match="not a complete"):
        checkpoint.resolve_resume(str(torn), tmp_path)


def test_keep_last_k_and_convert(uninterrupted, runs, tmp_path):
    cfg = BASE.replace(name="kept", output_dir=str(runs), save_steps=2, save_total_limit=2)
    run = runner.run(cfg, capture=True, timeout=600)
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
    # an edited config.yaml is a changed file of the checkpoint: refused by its checksum ...
    with pytest.raises(
        checkpoint.CheckpointCorruptError,
        match=r"config.yaml has 1,\d{3} bytes; 1,\d{3} were written at save",
    ):
        checkpoint.convert_checkpoint(other, tmp_path / "z")
    _rerecord(other, "config.yaml")  # ... and, recorded as if saved so, by the model check
    with pytest.raises(ConfigError, match=r"does not match the model.*missing: \['base_model"):
        checkpoint.convert_checkpoint(other, tmp_path / "z")


def _rerecord(ckpt: Path, name: str) -> None:
    """Record ``name``'s current size and SHA-256 in the COMPLETE marker, as a save would have."""
    marker = json.loads((ckpt / checkpoint.MARKER).read_text())
    marker["files"][name] = checkpoint.hash_files(ckpt, [name])[name]
    (ckpt / checkpoint.MARKER).write_text(json.dumps(marker))


def test_kill_after_step_3_of_6_then_resume(uninterrupted, runs):
    """SIGKILL every rank once step 3's checkpoint is complete; resume; same result as uninterrupted."""
    cfg = BASE.replace(name="killed", output_dir=str(runs), save_steps=1, save_total_limit=6)
    marker = runs / "killed" / "checkpoints" / "step-000003" / checkpoint.MARKER
    proc, _ = drills.launch_and_kill(cfg, 3)  # every process of the run
    assert proc.returncode != 0 and marker.is_file(), "the run finished before it could be killed"
    latest = checkpoint.latest_checkpoint(runs / "killed")
    assert latest is not None and 3 <= int(latest.name.split("-")[1]) < 6
    assert not (runs / "killed" / "final_model").exists()
    resumed = runner.run(cfg.replace(resume_from="latest"), capture=True, timeout=600).summary
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
            runner.preflight(cfg)
        msg = str(err.value)
        needed = runner.bytes_to_write(cfg, build_meta_model("tiny", load_tokenizer("tiny")))
        assert f"{needed:,} bytes" in msg and "bytes free" in msg
        assert not any(mnt.iterdir())  # nothing was started or written
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_checkpoint_size_estimate_matches_disk(runs):
    """The estimate used by the disk check against the bytes a real checkpoint took."""

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
        runner.preflight(cfg)
    assert (runs / "kept" / "config.yaml").read_text() == before  # nothing launched, nothing rewritten


# ------------------------------------------------------------------ verification (issue 16)
@pytest.fixture(scope="module")
def stopped(runs):
    """A 6-step run stopped after step 4, checkpoints every 2 steps, 2 kept: step-000002 and step-000004."""
    cfg = BASE.replace(name="stopped", output_dir=str(runs), save_steps=2, save_total_limit=2, stop_at_step=4)
    runner.run(cfg, capture=True, timeout=600)
    assert sorted(p.name for p in (cfg.run_dir / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    return cfg.replace(stop_at_step=None)


def _copy_run(cfg, tmp_path):
    """A copy of ``cfg``'s run folder under ``tmp_path`` (the tests damage it) and the config pointing there."""
    shutil.copytree(cfg.run_dir, tmp_path / cfg.name)
    return cfg.replace(output_dir=str(tmp_path), resume_from="latest")


def test_marker_records_size_and_sha256_of_every_file(stopped):
    ckpt = stopped.run_dir / "checkpoints" / "step-000004"
    marker = json.loads((ckpt / checkpoint.MARKER).read_text())
    on_disk = sorted(p.name for p in ckpt.iterdir() if p.name != checkpoint.MARKER)
    assert on_disk == sorted(marker["files"]) and marker["algorithm"] == "sha256"
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "rng_rank0.pt", "rng_rank1.pt"} <= set(on_disk)
    for name, rec in marker["files"].items():
        data = (ckpt / name).read_bytes()
        assert rec == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    t0 = time.perf_counter()
    checkpoint.verify_checkpoint(ckpt)
    took = time.perf_counter() - t0
    mib = sum(r["bytes"] for r in marker["files"].values()) / 2**20
    print(f"verified {mib:.1f} MiB in {took * 1e3:.0f} ms")  # ~11 MiB, ~20 ms here


def _flip(path: Path, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + n] = bytes(b ^ 0xFF for b in data[mid : mid + n])
    path.write_bytes(bytes(data))


def test_flipped_bytes_are_refused_naming_the_file_and_offering_the_older_checkpoint(stopped, tmp_path):
    """64 flipped bytes in a shard used to resume silently (and convert to weights of ~1e3)."""
    cfg = _copy_run(stopped, tmp_path)
    ckpts = cfg.run_dir / "checkpoints"
    shard, older = ckpts / "step-000004" / "__0_0.distcp", ckpts / "step-000002"
    _flip(shard)
    with pytest.raises(checkpoint.CheckpointCorruptError) as err:
        runner.preflight(cfg)
    msg = str(err.value)
    assert f"{shard} does not match the sha256 recorded at save" in msg
    assert f"The newest checkpoint that verifies is {older}: resume from it with --resume_from {older}" in msg
    runner.preflight(cfg.replace(resume_from=str(older)))  # the offered one passes
    with pytest.raises(checkpoint.CheckpointCorruptError) as err:
        checkpoint.convert_checkpoint(ckpts / "step-000004", tmp_path / "out")
    assert f"{shard} does not match" in str(err.value)
    assert f"convert it instead (smolfsdp convert {older} OUT)" in str(err.value)
    assert not (tmp_path / "out").exists()
    line = failures.explain_failure("", 1, cfg)
    assert f"the newest checkpoint that verifies is {older} ({shard} does not match" in line
    assert f"--resume {older}" in line


def test_missing_shard_is_refused_before_launch(stopped, tmp_path):
    cfg = _copy_run(stopped, tmp_path)
    ckpts = cfg.run_dir / "checkpoints"
    shard = ckpts / "step-000004" / "__1_0.distcp"
    shard.unlink()
    with pytest.raises(checkpoint.CheckpointCorruptError) as err:
        runner.preflight(cfg)
    assert f"{shard} is missing (the COMPLETE marker lists it" in str(err.value)
    assert f"--resume_from {ckpts / 'step-000002'}" in str(err.value)
    # the failure line of the run that wrote them recommends the good one, never the broken one
    line = failures.explain_failure("", 1, cfg)
    assert f"the newest checkpoint that verifies is {ckpts / 'step-000002'}" in line
    assert "resume with: smolfsdp train <the same flags> --resume " + str(ckpts / "step-000002") in line
    # the ranks' own check (sizes only, no hashing) refuses it too
    with pytest.raises(checkpoint.CheckpointCorruptError, match="is missing"):
        checkpoint.resolve_resume("latest", cfg.run_dir)


def test_checkpoint_from_before_checksums_is_accepted_with_a_warning(stopped, tmp_path, caplog):
    cfg = _copy_run(stopped, tmp_path)
    ckpt = cfg.run_dir / "checkpoints" / "step-000004"
    (ckpt / checkpoint.MARKER).write_text("ok\n")  # what smolfsdp wrote before checksums
    with caplog.at_level(logging.WARNING, logger="smolfsdp.checkpoint.verify"):
        assert checkpoint.resolve_resume("latest", cfg.run_dir, hashes=True) == ckpt
    assert "saved before smolfsdp recorded checksums" in caplog.text
    (ckpt / "__1_0.distcp").write_bytes(b"torn")  # what its .metadata points to is still checked
    with pytest.raises(
        checkpoint.CheckpointCorruptError, match=r"__1_0.distcp has 4 bytes; its .metadata reads"
    ):
        checkpoint.resolve_resume("latest", cfg.run_dir, hashes=True)


def test_resume_that_fits_is_not_refused(stopped, monkeypatch):
    """Resumed at step 4 of 6 with 2 checkpoints kept, the run adds one checkpoint, not three."""

    cfg = stopped.replace(resume_from="latest")
    meta = build_meta_model("tiny", load_tokenizer("tiny"))
    one = checkpoint.estimate_checkpoint_bytes(meta)
    final = runner.bytes_to_write(cfg.replace(save_steps=0), meta)
    assert runner.bytes_to_write(cfg, meta) == 3 * one + final  # a new run: K + 1 checkpoints at once
    resume_at = cfg.run_dir / "checkpoints" / "step-000004"
    assert runner.bytes_to_write(cfg, meta, resume_at) == one + final  # only step 6 is still to be written
    monkeypatch.setattr(checkpoint_disk, "free_bytes", lambda path: 2 * one + final)
    runner.preflight(cfg)  # fits: was refused while every checkpoint was counted again
    monkeypatch.setattr(checkpoint_disk, "free_bytes", lambda path: one // 2 + final)
    with pytest.raises(checkpoint.DiskSpaceError, match=f"about {one + final:,} bytes"):
        runner.preflight(cfg)


@pytest.mark.parametrize(
    "files",
    [{"../../etc/passwd": {"bytes": 1, "sha256": "0"}}, {"x": {"bytes": "1"}}, "not a mapping"],
)
def test_a_damaged_or_escaping_marker_is_refused(tmp_path, files):
    (tmp_path / checkpoint.MARKER).write_text(
        json.dumps({"format": 1, "algorithm": "sha256", "files": files})
    )
    problem = checkpoint.find_problem(tmp_path)
    assert problem == f"{tmp_path / checkpoint.MARKER} is damaged (not the JSON smolfsdp writes)."


# ------------------------------------------------------------------ lineage and faults (issue 27)
class _OneRank:
    """``torch.distributed`` as ``atomic_save`` uses it, for one process without a process group."""

    @staticmethod
    def barrier():
        pass

    @staticmethod
    def get_world_size():
        return 1

    @staticmethod
    def broadcast_object_list(objs, src=0):
        pass

    @staticmethod
    def all_gather_object(parts, obj):
        parts[0] = obj


def _save(run_dir: Path, step: int, keep=None, value: float = 0.0) -> Path:
    def write(tmp: Path) -> None:
        checkpoint.dcp.save({"w": torch.full((4,), value)}, checkpoint_id=str(tmp), no_dist=True)

    return checkpoint.atomic_save(run_dir, step, 0, write, keep=keep)


def test_keep_last_k_after_resuming_from_an_older_step_keeps_the_step_just_written(tmp_path, monkeypatch):
    """Steps 2..8 of an earlier run, then --resume_from step-4 --save_total_limit 1: the new step 6 stays,
    the stale step 8 (a branch the run left) is neither kept nor offered as the last checkpoint."""
    monkeypatch.setattr(checkpoint, "dist", _OneRank)
    monkeypatch.setattr(checkpoint, "_LAST", {})
    ckpts = tmp_path / "checkpoints"
    for step in (2, 4, 6, 8):
        _save(tmp_path, step, value=step)
    assert [p.name for p in checkpoint.current_lineage(ckpts)] == [f"step-00000{s}" for s in (8, 6, 4, 2)]
    checkpoint._LAST.clear()  # a new launch resumes from step 4
    assert checkpoint.resolve_resume(str(ckpts / "step-000004"), tmp_path) == ckpts / "step-000004"
    new6 = _save(tmp_path, 6, value=-6.0)  # no limit: the stale step 8 stays on disk, outside the lineage
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "step-000002",
        "step-000004",
        "step-000006",
        "step-000008",
    ]
    assert json.loads((new6 / checkpoint.MARKER).read_text())["parent"] == "step-000004"
    assert checkpoint.latest_checkpoint(tmp_path) == new6
    assert checkpoint.newest_good_checkpoint(ckpts)[0] == new6
    cfg = BASE.replace(name=tmp_path.name, output_dir=str(tmp_path.parent), max_steps=10)
    line = failures.explain_failure("", 1, cfg)
    assert f"the last complete checkpoint is {new6};" in line and "step-000008" not in line
    # a kill during the final save of a 6-step run: what exists and how to finish, not "resume"
    (tmp_path / "final_model.tmp").mkdir()
    line = failures.explain_failure("", 1, cfg.replace(max_steps=6))
    finish = (
        f"every step ran and {new6} is complete, but the final model was not written (its save was interrupted; "
        f"{tmp_path / 'final_model.tmp'} holds the interrupted save and can be deleted). Write it from that "
        f"checkpoint: smolfsdp convert {new6} {tmp_path / 'final_model'}"
    )
    assert finish in line and "resume" not in line
    with pytest.raises(ConfigError, match="nothing is left to train. Every step ran and") as err:
        checkpoint.check_resume_settings(new6, cfg.replace(max_steps=6))
    assert "Its final model is in" not in str(err.value)
    _save(tmp_path, 6, keep=1, value=-6.0)  # the same save with --save_total_limit 1
    # the left branch's higher step 8 is kept and named (issue 34; HF Trainer keeps it too), not resumed from
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000006", "step-000008"]
    assert checkpoint.latest_checkpoint(tmp_path) == ckpts / "step-000006"
    state = {"w": torch.zeros(4)}
    checkpoint.dcp_load(state, ckpts / "step-000006")
    assert state["w"].tolist() == [-6.0] * 4  # the checkpoint just written, not the stale one
    # markers written before lineage was recorded keep the old rule (every lower step continues); the kept
    # stale step 8 is deleted first, as its note says, so only the step just written is left
    shutil.rmtree(ckpts / "step-000008")
    marker = json.loads((new6 / checkpoint.MARKER).read_text())
    del marker["parent"], marker["saved_at"]
    (new6 / checkpoint.MARKER).write_text(json.dumps(marker))
    assert checkpoint.current_lineage(ckpts) == [new6]


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only; skipped elsewhere), unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mnt
    gc.collect()  # a failed torch.save's file object may still hold the disk open
    subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: detached even if something holds it


def test_a_disk_that_fills_during_a_save_is_named_as_a_full_disk(small_disk, monkeypatch):
    monkeypatch.setattr(checkpoint, "dist", _OneRank)
    monkeypatch.setattr(checkpoint, "_LAST", {})
    run_dir = small_disk / "run"
    good = _save(run_dir, 1)
    with pytest.raises(checkpoint.DiskFullError) as err:  # 4 MiB of float32 onto a 2 MiB disk: a real ENOSPC
        checkpoint.atomic_save(
            run_dir, 2, 0, lambda tmp: torch.save(torch.zeros(2**20), tmp / "big.pt"), keep=1
        )
    msg = str(err.value)
    assert "saving checkpoint step 2 ran out of disk space ([Errno 28] No space left on device" in msg
    assert f"on the filesystem mounted at {small_disk}:" in msg
    assert f"The last good checkpoint is {good}; once there is room, resume from it (--resume)" in msg
    assert checkpoint.latest_checkpoint(run_dir) == good and checkpoint.find_problem(good) is None
    # torch's zip writer reports a short write without errno ("unexpected pos"): named by the free space
    short = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")

    def torn(tmp):
        raise short

    with pytest.raises(
        checkpoint.DiskFullError, match=r"failed with RuntimeError: \[enforce fail.*unexpected pos 704"
    ):
        checkpoint.atomic_save(run_dir, 3, 0, torn)
    monkeypatch.setattr(checkpoint_disk, "free_bytes", lambda path: 10 * 2**30)  # room: another failure
    with pytest.raises(RuntimeError, match="unexpected pos") as other:
        checkpoint.atomic_save(run_dir, 3, 0, torn)
    assert not isinstance(other.value, checkpoint.DiskFullError)


def test_free_space_is_checked_where_a_symlinked_checkpoints_folder_really_is(small_disk, tmp_path):
    run_dir = tmp_path / "runs" / "linked"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").symlink_to(small_disk)
    big = 8 * 2**20  # fits the test machine's disk, not the 2 MiB one the checkpoints go to
    checkpoint.check_disk_space(run_dir, big)  # the run folder's own filesystem has room
    with pytest.raises(checkpoint.DiskSpaceError) as err:
        checkpoint.check_disk_space_each([(run_dir / "checkpoints", big), (run_dir / "final_model", 1000)])
    assert f"about {big:,} bytes of checkpoints and models to {run_dir / 'checkpoints'}" in str(err.value)
    assert f"filesystem has {shutil.disk_usage(small_disk).free:,} bytes free" in str(err.value)


def test_convert_onto_a_full_disk_says_so_and_leaves_nothing(stopped, small_disk):
    ckpt = stopped.run_dir / "checkpoints" / "step-000004"
    with pytest.raises(ConfigError) as err:  # the tiny model's safetensors alone is larger than 2 MiB
        checkpoint.convert_checkpoint(ckpt, small_disk / "out")
    assert f"writing {small_disk / 'out'} failed (" in str(err.value) and "No space left on device" in str(
        err.value
    )
    assert "The partial output was removed; free space or choose another folder." in str(err.value)
    gc.collect()
    assert list(small_disk.iterdir()) == []


# ------------------------------------------------------------------ issue 43: convert's output, refusals
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_convert_output_folder_is_readable_as_trains_final_model_is(stopped, tmp_path):
    """The folder convert moves into place was a ``mkdtemp`` (0700): nobody else could read the model."""
    out = checkpoint.convert_checkpoint(
        stopped.run_dir / "checkpoints" / "step-000004", tmp_path / "exported"
    )
    mask = _umask()
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask  # 0755 under umask 022, as train's final_model/
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~mask


def test_convert_into_a_folder_it_cannot_write_is_refused_before_the_model_is_built(stopped, monkeypatch):
    from smolfsdp.checkpoint import convert

    try:
        with tempfile.TemporaryFile(dir="/sys"):
            pytest.skip("/sys is writable here")
    except OSError:
        pass

    def never(*args, **kwargs):
        raise AssertionError("the model was built before the output folder was checked")

    monkeypatch.setattr(convert, "build_model", never)
    monkeypatch.setattr(convert, "verify_checkpoint", never)
    with pytest.raises(ConfigError) as err:  # sysfs refuses new files even to root (chmod does not stop root)
        checkpoint.convert_checkpoint(stopped.run_dir / "checkpoints" / "step-000004", "/sys/smolfsdp-out")
    msg = str(err.value)
    assert "\n" not in msg and "OUT /sys/smolfsdp-out is not writable" in msg and "in '/sys'" in msg
    assert "choose an output folder you can write to" in msg
    assert not Path("/sys/smolfsdp-out").exists()


def test_a_checkpoint_deleted_while_convert_reads_it_is_named(stopped, tmp_path, monkeypatch):
    """keep-last-K of a run still going (or a person) removes the checkpoint between the check and the load."""
    from smolfsdp.checkpoint import convert

    run = _copy_run(stopped, tmp_path / "copy")
    ckpt = run.run_dir / "checkpoints" / "step-000002"
    real_load = convert.dcp_load

    def load_after_deletion(state, path):
        shutil.rmtree(path)
        return real_load(state, path)

    monkeypatch.setattr(convert, "dcp_load", load_after_deletion)
    with pytest.raises(ConfigError) as err:
        checkpoint.convert_checkpoint(ckpt, tmp_path / "out")
    msg = str(err.value)
    assert "\n" not in msg and f"{ckpt} was deleted while convert read it" in msg
    assert "nothing was written" in msg and str(run.run_dir / "checkpoints" / "step-000004") in msg
    assert not (tmp_path / "out").exists()


def test_convert_reads_a_recorded_config_whose_unused_values_were_redacted(stopped, tmp_path):
    """The refusal of ``<redacted>`` values is for configs trained on; convert reads a checkpoint's config only
    for the model and LoRA settings (a redacted model name is still refused, by ``convert_model``)."""
    from smolfsdp.checkpoint.convert import plan_convert

    run = _copy_run(stopped, tmp_path / "copy")
    ckpt = run.run_dir / "checkpoints" / "step-000004"
    text = (ckpt / "config.yaml").read_text().replace("system_prompt: null", "system_prompt: Be <redacted>.")
    (ckpt / "config.yaml").write_text(text)
    plan = plan_convert(ckpt, tmp_path / "out")
    assert plan.cfg.model == "tiny" and plan.cfg.system_prompt == "Be <redacted>."


def test_resuming_a_finished_run_that_saved_no_final_model_says_it_finished(tmp_path):
    """``save_final_model: false`` writes no final_model/: nothing was interrupted."""
    cfg = BASE.replace(name="nofinal", output_dir=str(tmp_path), save_final_model=False)
    ckpt = cfg.run_dir / "checkpoints" / "step-000006"
    ckpt.mkdir(parents=True)
    cfg.save(ckpt / "config.yaml")
    with pytest.raises(ConfigError) as err:
        checkpoint.check_resume_settings(ckpt, cfg.replace(resume_from="latest"))
    msg = str(err.value)
    assert "\n" not in msg and "interrupted" not in msg
    assert f"{ckpt} is at step 6 of max_steps=6: the run finished" in msg
    assert "save_final_model: false" in msg and f"smolfsdp convert {ckpt} OUT" in msg
    # the same run with save_final_model true and no final model: its save was interrupted (unchanged)
    cfg.replace(save_final_model=True).save(ckpt / "config.yaml")
    with pytest.raises(ConfigError, match="its save was interrupted"):
        checkpoint.check_resume_settings(ckpt, cfg.replace(save_final_model=True, resume_from="latest"))
