"""Run a function on N gloo ranks (spawned processes, free port, CUDA hidden, timeout).

    results = run_distributed(fn, 2, arg1, arg2)   # fn(rank, world_size, *args) -> picklable

Each rank's return value comes back in a list ordered by rank; an exception in any rank fails the
caller with that rank's traceback.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, out_dir, fn, args):
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
        }
    )
    import torch.distributed as dist

    result_path = Path(out_dir) / f"rank{rank}.pt"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        torch.save({"ok": True, "result": result}, result_path)
        dist.barrier()
    except BaseException:  # report any failure to the parent, then exit non-zero
        torch.save({"ok": False, "error": traceback.format_exc()}, result_path)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, timeout: float = 180.0):
    ctx = mp.get_context("spawn")
    port = _free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, port, out_dir, fn, args))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
        results = []
        for r in range(world_size):
            path = Path(out_dir) / f"rank{r}.pt"
            if not path.exists():
                raise RuntimeError(
                    f"rank {r} produced no result (timeout {timeout}s or crash, exit code "
                    f"{procs[r].exitcode})"
                )
            data = torch.load(path, weights_only=False)
            if not data["ok"]:
                raise RuntimeError(f"rank {r} failed:\n{data['error']}")
            results.append(data["result"])
        return results


def kill_run_when(cfg, marker: Path, timeout: float = 300.0) -> int:
    """Start ``smolfsdp train`` for ``cfg`` under torchrun, SIGKILL every process once ``marker`` exists.

    torchrun's workers live in their own process groups: the whole tree is killed, workers first.
    Returns torchrun's exit code (non-zero when it was killed before finishing).
    """
    import signal
    import subprocess
    import time

    import psutil

    from smolfsdp.launch.torchrun import launch_env, torchrun_command

    cfg_path = Path(cfg.output_dir) / f"{cfg.name}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg.save(cfg_path)
    proc = subprocess.Popen(
        torchrun_command(cfg.nproc, ["train", "--config", str(cfg_path)]),
        env=launch_env(cfg.nproc),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.005)
    tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    for child in tree:
        child.send_signal(signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    psutil.wait_procs(tree, timeout=30)
    return proc.returncode
