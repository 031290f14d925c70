"""OpenMP threads per rank (issue 42): the free cores shared among this node's processes, a user's
OMP_NUM_THREADS kept, and the launcher says which value it set and why before the ranks start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from smolfsdp.config import TrainConfig
from smolfsdp.launch import rank_env, torchrun
from smolfsdp.launch.rank_env import THREADS_NOTE, launch_env, omp_threads

TWO = (2, "sched_getaffinity")


@pytest.mark.parametrize(
    ("cores", "load", "nproc", "threads"),
    [
        (TWO, 0.1, 1, 2),  # a quiet 2-core box: one process may use both
        (TWO, 1.2, 1, 1),  # another process busy: one core left, not cpu_count // nproc = 2
        (TWO, 0.1, 2, 1),  # two ranks share two cores
        (TWO, 7.0, 4, 1),  # busier than the cores: still one thread each
        ((16, "sched_getaffinity"), 3.4, 2, 6),  # 16 usable, 3 busy: 13 free, 6 each
        ((16, "cpu_count"), 0.4, 2, 8),
    ],
)
def test_threads_are_the_free_cores_shared(cores, load, nproc, threads):
    value, why = omp_threads(nproc, {}, cores=cores, load=load)
    assert value == threads
    assert why.startswith(f"OMP_NUM_THREADS={threads} per process for {nproc} process(es): {cores[0]} usable")
    assert f"({cores[1]}), load average {load:.2f}" in why


def test_a_users_omp_num_threads_is_kept_and_said():
    assert omp_threads(2, {"OMP_NUM_THREADS": "3"}, cores=TWO, load=0.0) == (
        "3",
        "OMP_NUM_THREADS=3 per process, kept as set in the environment",
    )


def test_usable_cores_read_the_affinity_mask():
    n, how = rank_env.usable_cores()
    assert how == "sched_getaffinity" and n == len(__import__("os").sched_getaffinity(0)) >= 1


def test_launch_env_sets_the_threads_and_the_reason(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(rank_env, "usable_cores", lambda: TWO)
    monkeypatch.setattr(rank_env, "busy_cores", lambda: 1.0)
    env = launch_env(1)
    assert env["OMP_NUM_THREADS"] == "1"
    assert env[THREADS_NOTE].startswith("OMP_NUM_THREADS=1 per process for 1 process(es): 2 usable core(s)")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert launch_env(1)["OMP_NUM_THREADS"] == "2" and "kept" in launch_env(1)[THREADS_NOTE]


def test_the_launcher_says_which_threads_it_set(monkeypatch, tmp_path, capsys):
    """The launch, with torchrun replaced by a process that prints what it got: the note comes first."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(rank_env, "usable_cores", lambda: TWO)
    monkeypatch.setattr(rank_env, "busy_cores", lambda: 0.0)
    child = "import os; print('rank sees OMP_NUM_THREADS=' + os.environ['OMP_NUM_THREADS'])"
    monkeypatch.setattr(
        torchrun, "spawn", lambda cmd, **kw: subprocess.Popen([sys.executable, "-c", child], **kw)
    )
    cfg = TrainConfig(name="threads", nproc=1, output_dir=str(tmp_path))
    out = torchrun.launch(cfg, capture=True, timeout=60)
    note = "[smolfsdp] OMP_NUM_THREADS=2 per process for 1 process(es): 2 usable core(s) (sched_getaffinity)"
    assert out.stdout.startswith(note)
    assert "rank sees OMP_NUM_THREADS=2" in out.stdout
    torchrun.launch(cfg, capture=False, timeout=60)
    assert capsys.readouterr().err.startswith(note)
