"""Count the bytes of parameter shards, gradient shards and AdamW state on each rank after one step.

Runs every case of ``smolfsdp.measure.memory_measure.CASES`` (FSDP1/FSDP2 x full/LoRA x fp32/bf16/mixed) on
the tiny SmolLM3 and writes one JSON list (all ranks) for the chapter "Where the memory goes".

    torchrun --standalone --nproc-per-node 2 scripts/measure_memory.py --out /tmp/measured_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from smolfsdp.measure.memory_measure import measure_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where rank 0 writes the JSON list")
    args = parser.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # gloo on CPU: the bytes of the CPU recipe
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    rows = measure_all(rank, world)
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        flat = [row for per_rank in gathered for row in per_rank]
        with open(args.out, "w") as fh:
            json.dump(flat, fh, indent=1)
        print(f"[measure_memory] {len(flat)} rows from {world} ranks -> {args.out}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # The results are written and every rank passed the barrier. Leave without running C++ static
    # destructors: on a loaded 2-core CI machine a gloo rank sometimes aborted in them at exit
    # ("terminate called without an active exception", SIGABRT), failing the chapter after the work.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
