"""Start a run's processes in a subprocess: ``torchrun --standalone --nproc-per-node N``.

Chapters and ``smolfsdp train`` call this; nothing creates a process group inside a notebook
kernel. The resolved config travels as a YAML file, so each rank sees exactly what was checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from smolfsdp.config import TrainConfig


def torchrun_command(nproc: int, args: list[str], module: str = "smolfsdp.cli") -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m <module> <args>``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        *args,
    ]


def launch_env(nproc: int) -> dict[str, str]:
    env = dict(os.environ)
    # Two processes on a 2-core box: one intra-op thread each, or they fight over the cores.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def launch(
    cfg: TrainConfig, *, capture: bool = False, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run ``smolfsdp train`` on ``cfg.nproc`` processes and wait for it.

    With ``capture`` the combined output is returned in ``.stdout`` (for notebooks and tests);
    otherwise it streams to this process's terminal.
    """
    with tempfile.TemporaryDirectory(prefix="smolfsdp-") as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        cfg.save(cfg_path)
        cmd = torchrun_command(cfg.nproc, ["train", "--config", str(cfg_path)])
        proc = subprocess.Popen(
            cmd,
            env=launch_env(cfg.nproc),
            text=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except BaseException:
            # Ctrl-C, a timeout or any error here: pass SIGINT on so torchrun stops its workers
            # (subprocess.run would SIGKILL torchrun and leave the ranks training as orphans).
            stop(proc)
            raise
        return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGINT the launcher (torchrun forwards it to every rank), then SIGTERM, then SIGKILL."""
    import signal

    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
