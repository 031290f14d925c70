"""Stopping cleanly (issue 27): nothing a test or a chapter launched outlives it, nothing is left in the
temporary folder.

``smolfsdp.launch.processes`` starts launched processes in their own process group and stops them as a
group; ``tests/conftest.py`` installs its SIGTERM/SIGINT handler in pytest. The parent below does what
pytest does with that handler, with a launched sleeper (and the sleeper's own child, as torchrun has ranks)
in place of a training run.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from smolfsdp.launch import processes

ROOT = Path(__file__).resolve().parents[1]

#: a launched process that starts one child of its own (torchrun and a rank), writes both pids, sleeps
SLEEPER = """\
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".part", "w").write(f"{child.pid}")
import os; os.replace(sys.argv[1] + ".part", sys.argv[1])
time.sleep(600)
"""

#: a pytest-like parent: the conftest handler installed, then a launch through run_group
PARENT = """\
import sys
from smolfsdp.launch import processes
processes.stop_on_signals()
try:
    processes.run_group([sys.executable, "-c", sys.argv[1], sys.argv[2]], timeout=600)
except KeyboardInterrupt:
    sys.exit(2)  # what pytest returns after an interrupted session
"""


def _start_parent(tmp_path):
    pids = tmp_path / "pids"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, SLEEPER, str(pids)], env=env)
    deadline = time.monotonic() + 60
    while not pids.is_file():
        assert parent.poll() is None and time.monotonic() < deadline, "the sleeper never started"
        time.sleep(0.05)
    family = psutil.Process(parent.pid).children(recursive=True)
    assert len(family) == 2 and int(pids.read_text()) in {p.pid for p in family}
    return parent, family


def _cleanup(parent, family):
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if parent.poll() is None:
        parent.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_a_pytest_like_parent_stops_what_it_launched(tmp_path, sig):
    parent, family = _start_parent(tmp_path)
    try:
        leader = psutil.Process(family[0].pid)
        assert os.getpgid(leader.pid) == leader.pid != os.getpgid(parent.pid)  # a group of its own
        parent.send_signal(sig)
        assert parent.wait(timeout=30) == 2
        _, alive = psutil.wait_procs(family, timeout=10)
        assert alive == []
    finally:
        _cleanup(parent, family)


def test_a_killed_launcher_takes_its_launched_process_with_it(tmp_path):
    """SIGKILL leaves no chance to clean up: the launched process gets SIGTERM from the kernel
    (PR_SET_PDEATHSIG), as torchrun does, which then stops its ranks."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    parent, family = _start_parent(tmp_path)
    try:
        launched = next(p for p in family if p.ppid() == parent.pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        _, alive = psutil.wait_procs([launched], timeout=10)
        assert alive == []
    finally:
        _cleanup(parent, family)


def test_run_group_stops_the_whole_group_on_a_timeout(tmp_path):
    pids = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        processes.run_group([sys.executable, "-c", SLEEPER, str(pids)], timeout=4)
    assert pids.is_file(), "the sleeper did not start within the timeout"
    assert _gone(int(pids.read_text())), "the launched process's own child outlived its group"


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (absent or a zombie); a SIGKILLed process takes a moment to go."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_gotcha_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    """What the chapter's gotcha cell calls (``run_gotchas`` without a folder), on the cheapest case: the
    temporary folder holds the same entries (none) and bytes (0) afterwards."""
    from smolfsdp.gotchas import run_all as gotchas

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # tempfile.gettempdir() for this process
    monkeypatch.setenv("TMPDIR", str(tmp))  # and for whatever it launches
    said: list[str] = []
    results = gotchas.run_gotchas(["checkpoint_disk_full"], progress=said.append)
    assert results["checkpoint_disk_full"].failing["outcome"] in {"skipped", "error"}
    # without a folder too, the progress callback is told what starts (chapter 06's cell prints it)
    assert said == ["running checkpoint_disk_full (runs in this process, no process group)"]
    left = list(tmp.rglob("*"))
    assert left == [] and sum(p.stat().st_size for p in left if p.is_file()) == 0


def test_chapter_runs_is_an_emptied_folder_under_runs_book(tmp_path, monkeypatch):
    from smolfsdp import paths
    from smolfsdp.errors import ConfigError

    monkeypatch.setattr(paths, "repo_root", lambda: tmp_path)
    first = paths.chapter_runs("07_scaling")
    (first / "old_run").mkdir()
    (tmp_path / "runs" / "book" / "other").mkdir()
    assert paths.chapter_runs("07_scaling") == tmp_path / "runs" / "book" / "07_scaling"
    assert list(first.iterdir()) == [] and (tmp_path / "runs" / "book" / "other").is_dir()
    for bad in ("", "..", "../x", "a/b"):
        with pytest.raises(ConfigError, match="one plain folder name"):
            paths.chapter_runs(bad)
