"""Issue 34: convert into a symlinked OUT is refused up front; a killed convert's hidden temporary folder
is removed by the next convert (only ours, only when its process is gone)."""

import os
import subprocess
import sys

import pytest

from smolfsdp.checkpoint.convert import check_convert_out, remove_stale_tmps
from smolfsdp.errors import ConfigError


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("overwrite", [False, True])
def test_convert_refuses_a_symlinked_out_before_any_work(tmp_path, overwrite):
    ckpt, real = tmp_path / "step-1", tmp_path / "real"
    ckpt.mkdir()
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ConfigError) as err:
        check_convert_out(ckpt, tmp_path / "link", overwrite)
    assert str(err.value) == (
        f"OUT {tmp_path / 'link'} is a symbolic link (to {real}); convert replaces the folder OUT itself, "
        f"not what a link points to. Give the real folder instead: {real}"
    )
    assert (tmp_path / "link").is_symlink() and real.is_dir()


def test_a_killed_converts_tmp_is_removed_only_when_its_process_is_gone(tmp_path):
    out = tmp_path / "exported"
    dead = tmp_path / f".exported.{_dead_pid()}.k3j_x.tmp"
    alive = tmp_path / f".exported.{os.getpid()}.ab12.tmp"  # a convert still running (this process)
    other = tmp_path / ".other.1.zz.tmp"  # another OUT's
    not_ours = tmp_path / ".exported.notapid.tmp"  # not the pattern convert writes
    for folder in (dead, alive, other, not_ours):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert remove_stale_tmps(out) == [dead]
    assert not dead.exists()
    assert alive.is_dir() and other.is_dir() and not_ours.is_dir()


def test_a_header_bomb_is_refused_within_the_byte_bound(tmp_path):
    """A 24 MiB list in the header under a 32 MiB byte bound: refused, and the read's Python memory
    (tracemalloc peak, in a fresh process) stays under the bound (today: ~4 bytes per byte, past it)."""
    trace = tmp_path / "bomb.json"
    with trace.open("w") as f:
        f.write('{"big": [' + "0," * (12 * 2**20) + '0], "traceEvents": []}')
    code = (
        "import sys, tracemalloc\n"
        "from smolfsdp.traces.load import read_trace, TraceError\n"
        "tracemalloc.start()\n"
        "try:\n    read_trace(sys.argv[1]); print('read')\n"
        "except TraceError as err:\n    print('refused', err)\n"
        "print(tracemalloc.get_traced_memory()[1])\n"
    )
    env = {**os.environ, "SMOLFSDP_TRACE_MAX_BYTES": str(32 * 2**20)}
    proc = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, env=env)
    out = proc.stdout.splitlines()
    assert out[0].startswith(f"refused {trace}: more than 4,194,304 bytes before traceEvents"), proc.stderr
    assert int(out[-1]) < 32 * 2**20


def test_a_folder_given_as_a_trace_is_named_a_folder(tmp_path):
    from smolfsdp.traces.load import read_trace

    (tmp_path / "rank0.json.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as err:
        read_trace(tmp_path)
    assert str(err.value) == (
        f"{tmp_path} is a folder, not a trace file; give one .json/.json.gz trace in it, e.g. "
        f"{tmp_path / 'rank0.json.gz'}"
    )


def test_a_killed_launchers_config_is_removed_at_the_next_start(tmp_path):
    from smolfsdp.launch.torchrun import remove_stale_configs

    dead, alive = tmp_path / f"smolfsdp-{_dead_pid()}-ab_1", tmp_path / f"smolfsdp-{os.getpid()}-cd_2"
    foreign = tmp_path / f"smolfsdp-{_dead_pid()}-ef_3"  # holds more than our config: not ours
    for folder in (dead, alive, foreign):
        folder.mkdir()
        (folder / "config.yaml").write_text("hub_token: hf_secret\n")
    (foreign / "notes.txt").write_text("someone's")
    assert remove_stale_configs(tmp_path) == [dead]
    assert not dead.exists() and (alive / "config.yaml").is_file() and (foreign / "notes.txt").is_file()


class _OneRank:
    """``torch.distributed`` as ``atomic_save`` uses it, for one process without a process group."""

    barrier = staticmethod(lambda: None)
    get_world_size = staticmethod(lambda: 1)
    broadcast_object_list = staticmethod(lambda objs, src=0: None)

    @staticmethod
    def all_gather_object(parts, obj):
        parts[0] = obj


def test_keep_last_k_after_an_older_resume_keeps_and_names_the_newer_step(tmp_path, monkeypatch, capsys):
    """Steps 2, 4, 6 saved; a resume from step 2 with --save_total_limit 1 saves 3, then 4: step 6 (the
    run before's newer checkpoints 4 and 6 are kept and named once; 4 is replaced by the new run's own."""
    import torch

    from smolfsdp.checkpoint import dcp as checkpoint

    monkeypatch.setattr(checkpoint, "dist", _OneRank)
    monkeypatch.setattr(checkpoint, "_LAST", {})

    def save(step, keep=None):
        def write(tmp):
            checkpoint.dcp.save({"w": torch.full((2,), float(step))}, checkpoint_id=str(tmp), no_dist=True)

        return checkpoint.atomic_save(tmp_path, step, 0, write, keep=keep)

    ckpts = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        save(step)
    checkpoint._LAST.clear()
    checkpoint.resolve_resume(str(ckpts / "step-000002"), tmp_path)
    capsys.readouterr()
    save(3, keep=1)  # today's main deletes 4 and 6 without a word
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000003", "step-000004", "step-000006"]
    err = capsys.readouterr().err
    assert (
        f"smolfsdp: kept {ckpts / 'step-000004'}" in err and f"smolfsdp: kept {ckpts / 'step-000006'}" in err
    )
    save(4, keep=1)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000004", "step-000006"]
    assert capsys.readouterr().err == ""  # named once
    assert checkpoint.latest_checkpoint(tmp_path) == ckpts / "step-000004"
