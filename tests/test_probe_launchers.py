"""The book's CPU-by-design probes and gotchas on a box where GPUs are visible (issue 24).

There is no GPU here, so "GPUs visible" is a stand-in: ``torch.cuda.is_available()`` answers as CUDA
does for ``CUDA_VISIBLE_DEVICES`` (unset: the GPUs are seen; empty: none is). Under it a plain
``launch_env`` makes ``init_distributed()`` pick NCCL (the failure a GPU box showed: "No backend
type associated with device type cpu" once a probe shards on CPU); every probe launcher's
environment must give gloo on CPU. One real launch (one rank through torchrun) runs the stand-in
inside the rank and reads the backend the rank chose.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import ROOT

from smolfsdp.gotchas import cases_local
from smolfsdp.gotchas import run_all as runner
from smolfsdp.launch import probe, processes, torchrun
from smolfsdp.probes import dtype_rule, measured, mechanics, step
from smolfsdp.sharding.distributed import choose_backend

#: The stand-in, as a sitecustomize for launched ranks (and the same function in this process).
STANDIN = """import os
import torch
torch.cuda.is_available = lambda: os.environ.get("CUDA_VISIBLE_DEVICES", "unset") != ""
"""


def _gpus_visible() -> bool:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset") != ""


def _backend_under(env: dict[str, str]) -> str:
    """The backend ``init_distributed()`` would pick in a rank started with ``env`` on the stand-in box."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return choose_backend("cuda" if torch.cuda.is_available() else "cpu")
    finally:
        os.environ.clear()
        os.environ.update(saved)


class _Captured(Exception):
    """Raised by the fake subprocess.run with what a launcher would have started."""

    def __init__(self, cmd, env):
        super().__init__("captured")
        self.cmd, self.env = cmd, env


def _capture(*args, env=None, **kwargs):
    raise _Captured(args[0], env)


# every chapter launcher of ranks that shard on CPU on purpose, called as the chapter calls it
LAUNCHERS = {
    "dtype_rule.check_dtype_rule": lambda tmp: dtype_rule.check_dtype_rule(tmp),
    "mechanics.measure_mechanics": lambda tmp: mechanics.measure_mechanics(1, tmp),
    "step.measure_step_variants": lambda tmp: step.measure_step_variants(tmp),
    "measured.measure_tiny_memory": lambda tmp: measured.measure_tiny_memory(),
    "runner._launch": lambda tmp: runner._launch(["any"], tmp, 2),
    "cases_local.tracker_wrong_project": lambda tmp: cases_local.tracker_wrong_project(tmp),
}


@pytest.fixture
def gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", _gpus_visible)
    monkeypatch.setattr(cases_local.subprocess, "run", _capture)  # the trackio gotcha's plain subprocess
    # torchrun launches go through launch.processes (own process group): the child is started by spawn
    monkeypatch.setattr(processes, "spawn", lambda cmd, env=None, **kw: _capture(cmd, env=env))


def test_standin_reproduces_the_gpu_box(gpus_visible):
    """Without hiding, a rank on the stand-in picks NCCL: the failure the launchers must avoid."""
    assert _backend_under(torchrun.launch_env(2)) == "nccl"
    assert _backend_under(probe.cpu_probe_env(2)) == "gloo"


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_every_probe_launcher_hides_the_gpus(gpus_visible, tmp_path, name):
    with pytest.raises(_Captured) as got:
        LAUNCHERS[name](tmp_path)
    env = got.value.env
    assert env["CUDA_VISIBLE_DEVICES"] == "" and _backend_under(env) == "gloo"
    if name != "cases_local.tracker_wrong_project":  # a plain process; the others torchrun
        assert "torch.distributed.run" in got.value.cmd


def test_run_probe_hides_the_gpus_even_when_env_names_them(gpus_visible):
    with pytest.raises(_Captured) as got:
        probe.run_probe("x", "smolfsdp.probes.step", [], 2, 10, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert got.value.env["CUDA_VISIBLE_DEVICES"] == ""


RANK = """import os, sys
from pathlib import Path
import torch
from smolfsdp.sharding.distributed import init_distributed, teardown
info = init_distributed()
os.environ.pop("CUDA_VISIBLE_DEVICES")  # the launcher's hiding undone: the stand-in then sees GPUs
Path(sys.argv[1]).write_text(f"{info.backend} {info.device.type} {torch.cuda.is_available()}")
teardown()
"""


def test_one_real_launch_under_the_standin_picks_gloo(tmp_path):
    """run_probe starts one rank through torchrun with the stand-in loaded: it picks gloo on CPU, and
    the same rank, once the launcher's CUDA_VISIBLE_DEVICES is gone, is told that GPUs are there."""
    (tmp_path / "sitecustomize.py").write_text(STANDIN)
    script, out = tmp_path / "rank.py", tmp_path / "backend.txt"
    script.write_text(RANK)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    probe.run_probe("backend probe", script, [str(out)], 1, 300, env=env)
    assert out.read_text() == "gloo cpu True"


def test_a_probe_says_what_starts_in_a_notebook_only(monkeypatch, capsys):
    """Issue 33: a chapter's probe cell (chapter 02's mechanics and step probes, 24-43 s here) says what it starts
    before the wait, inside a Jupyter kernel; elsewhere, or with ``announce=False`` (run_gotchas says it
    itself), nothing."""
    import subprocess
    import sys

    monkeypatch.setattr(probe, "run_group", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    probe.run_probe("step probe", "smolfsdp.probes.step", [], 2, 60)
    assert capsys.readouterr().out == ""
    monkeypatch.setitem(sys.modules, "ipykernel", sys)
    probe.run_probe("step probe", "smolfsdp.probes.step", [], 2, 60)
    probe.run_probe("dtype-rule run", "smolfsdp.probes.dtype_rule", [], 1, 60)
    probe.run_probe("gotchas ['wrap_class']", "smolfsdp.gotchas.run_all", [], 2, 60, announce=False)
    assert capsys.readouterr().out.splitlines() == [
        "step probe: starting 2 CPU ranks (torchrun, gloo)",
        "dtype-rule run: starting 1 CPU rank (torchrun, gloo)",
    ]


def test_a_long_probe_says_it_still_runs_in_a_notebook(monkeypatch, capsys):
    """Issue 33: a probe's output is captured until it ends (chapter 06's gotchas waited ~3 min after one line);
    inside a kernel a line every HEARTBEAT_S seconds says it still runs, also where announce=False; outside, none."""
    import subprocess
    import sys
    import time

    from smolfsdp.launch import progress

    def slow(cmd, **kw):
        time.sleep(0.35)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(probe, "run_group", slow)
    monkeypatch.setattr(probe, "HEARTBEAT_S", 0.1)
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    probe.run_probe("gotchas ['wrap_class']", "smolfsdp.gotchas.run_all", [], 2, 60, announce=False)
    assert capsys.readouterr().out == ""
    monkeypatch.setitem(sys.modules, "ipykernel", sys)
    probe.run_probe("gotchas ['wrap_class']", "smolfsdp.gotchas.run_all", [], 2, 60, announce=False)
    lines = capsys.readouterr().out.splitlines()
    assert 2 <= len(lines) <= 4 and all(
        ln.startswith("gotchas ['wrap_class']: still running, ") for ln in lines
    )
    with progress.heartbeat("x", None) as beat:  # off: no thread started
        assert not beat._thread.is_alive()


def test_the_heartbeat_fills_only_the_silences_between_relayed_lines():
    """Issue 33: a streamed run (runner.run in a kernel) was silent for 10-15 s while its ranks started; its lines
    go through heartbeat.relay, and a "still running" line comes only where none came for every_s seconds."""
    import time

    from smolfsdp.launch import progress

    said: list[str] = []
    with progress.heartbeat("run 'x'", 0.3, said.append) as beat:
        for i in range(8):  # a line every 0.05 s for 0.4 s: no heartbeat between them
            time.sleep(0.05)
            beat.relay(f"line {i}")
        time.sleep(0.75)  # then silence: a heartbeat about 0.3 s and 0.6 s after the last line
    assert said[:8] == [f"line {i}" for i in range(8)], said
    beats = said[8:]
    assert 1 <= len(beats) <= 3 and all(b.startswith("run 'x': still running, ") for b in beats), said
