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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous)."""
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
    port = free_port()
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
