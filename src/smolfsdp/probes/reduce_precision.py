"""What a bf16 gradient reduction costs against an fp32 one: its error against an fp64 sum, on gloo ranks.

Seed 2 sets ``MixedPrecisionPolicy(reduce_dtype=bf16)``; the package reduces in fp32. FSDP2 reduce-scatters
each unit's gradients in ``reduce_dtype`` (``reduce_scatter_tensor``, SUM, then divides by the world size),
and casts the result to the sharded parameter's dtype. This probe runs that collective on ``world`` gloo
ranks, each a thread of this process with its own ``ProcessGroupGloo`` on one in-process ``HashStore``
(no launch, no process group in the caller), on bf16 gradients (what a bf16 backward hands the reduction):

the relative L2 error of the reduced shards against the fp64 mean of the same bf16 inputs, for a bf16
reduction, an fp32 one cast to bf16 (seed 2's bf16 adapters keep bf16 gradients) and an fp32 one kept in
fp32 (the package's fp32 adapters). No time is measured: 8 gloo threads on a shared 2-core CPU time the
scheduler (ratios from 0.04 to 20 in one run when tried), and CPU gloo says nothing about NCCL on GPUs.

On 2 ranks a bf16 sum of two bf16 values is rounded once, as the fp32 sum cast to bf16 is: the two are
equal by construction; from 4 ranks on the bf16 sum rounds at each step. About a second for (2, 4, 8)
once torch is imported.

    python -c "from smolfsdp.probes.reduce_precision import reduce_cost; print(reduce_cost())"
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: the forms compared: (label, reduce dtype, dtype of the reduced shard)
FORMS = (
    ("bf16 reduce", torch.bfloat16, torch.bfloat16),
    ("fp32 reduce, bf16 gradient", torch.float32, torch.bfloat16),
    ("fp32 reduce, fp32 gradient", torch.float32, torch.float32),
)


def _inputs(world: int, numel: int, seed: int) -> list[torch.Tensor]:
    """Each rank's gradient: N(0, 1) values rounded to bf16, different per rank."""
    return [
        torch.randn(numel, generator=torch.Generator().manual_seed(seed + r)).to(torch.bfloat16)
        for r in range(world)
    ]


def _ranks(world: int, body) -> list[Any]:
    """Run ``body(pg, rank)`` on ``world`` threads, each with a gloo group of ``world`` ranks."""
    store, out, errors = dist.HashStore(), [None] * world, []

    def one(rank: int) -> None:
        try:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timedelta(seconds=60)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            out[rank] = body(dist.ProcessGroupGloo(store, rank, world, opts), rank)
        except Exception as err:  # re-raised in the caller's thread with the rank named
            errors.append(f"rank {rank}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("reduce_cost: gloo ranks failed: " + "; ".join(errors))
    return out


def _reduce(pg, rank: int, grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's reduced shard (the mean), reduced in bf16 and in fp32."""
    world = len(grads)
    shard = grads[rank].numel() // world
    out = {}
    for key, rdt in {"bf16": torch.bfloat16, "fp32": torch.float32}.items():
        inp, got = grads[rank].to(rdt), torch.empty(shard, dtype=rdt)
        pg._reduce_scatter_base(got, inp).wait()
        out[key] = got / world
    return out


def reduce_cost(world_sizes=(2, 4, 8), numel: int = 1 << 14, seed: int = 0) -> dict:
    """Per world size: ``relative_l2`` (each form of :data:`FORMS` against the fp64 mean),
    ``bf16_equals_fp32_bf16`` (the bf16 reduction bit-equal to the fp32 one cast to bf16) and ``numel`` (values
    per rank). ``numel`` must divide by every world size; raises ValueError otherwise, RuntimeError naming the
    rank if gloo fails."""
    if any(numel % w for w in world_sizes):
        raise ValueError(
            f"numel={numel} must divide by every world size {tuple(world_sizes)}: use a power of 2"
        )
    out = {}
    for world in world_sizes:
        grads = _inputs(world, numel, seed)
        ref = torch.stack([g.double() for g in grads]).sum(0) / world
        per_rank = _ranks(world, lambda pg, rank, grads=grads: _reduce(pg, rank, grads))
        got = {
            label: torch.cat([r["fp32" if rdt == torch.float32 else "bf16"] for r in per_rank])
            .to(kept)
            .double()
            for label, rdt, kept in FORMS
        }
        out[world] = {
            "relative_l2": {k: float((v - ref).norm() / ref.norm()) for k, v in got.items()},
            "bf16_equals_fp32_bf16": bool(torch.equal(got["bf16 reduce"], got["fp32 reduce, bf16 gradient"])),
            "numel": numel,
        }
    return out
