"""FSDP2's one-dtype rule, tried for real: which mixes of parameter dtypes ``fully_shard`` accepts.

Used by the chapters "What the seeds say" and "FSDP1 vs FSDP2". ``check_dtype_rule`` launches this module
with torchrun on one CPU process (gloo; never a process group in the notebook kernel). The process
builds three small models, shards each with ``fully_shard`` (then with FSDP1) and runs one forward and backward:

* ``frozen_bf16_beside_trainable_fp32``: one group holds trainable fp32 weights and a frozen bf16 one;
* ``trainable_fp32_and_bf16_same_group``: one group holds trainable weights of both dtypes;
* ``trainable_fp32_and_bf16_own_groups``: the same weights, each dtype in its own ``fully_shard`` group.

torch 2.13 checks the rule in ``FSDPParamGroup._init_mp_dtypes`` (torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py): the *trainable* parameters of one group must share their original dtype. FSDP1 flattens
every parameter of a unit, frozen or not, into one FlatParameter, which has one dtype
(torch/distributed/fsdp/_flat_param.py, ``_validate_tensors_to_flatten``).

    python -m torch.distributed.run --standalone --nproc-per-node 1 -m smolfsdp.probes.dtype_rule --out OUT
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

from smolfsdp.launch.probe import probe_main, read_results, run_probe

CASES = (
    "frozen_bf16_beside_trainable_fp32",
    "trainable_fp32_and_bf16_same_group",
    "trainable_fp32_and_bf16_own_groups",
)


class _Pair(nn.Module):
    """Two linear layers; ``second`` may be cast to bf16 and frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x).to(self.second.weight.dtype)).float()


def _shard(model: _Pair, version: int, own_group: bool) -> nn.Module:
    if version == 2:
        if own_group:
            fully_shard(model.second)  # the bf16 weights get their own group
        fully_shard(model)
        return model
    cpu = torch.device("cpu")
    if own_group:  # FSDP1: the bf16 weights get their own unit, hence their own FlatParameter
        model.second = FullyShardedDataParallel(model.second, device_id=cpu, use_orig_params=True)
    return FullyShardedDataParallel(model, device_id=cpu, use_orig_params=True)


def _try(case: str, version: int) -> dict:
    torch.manual_seed(0)
    model = _Pair()
    model.second.to(torch.bfloat16)
    if case == "frozen_bf16_beside_trainable_fp32":
        model.second.requires_grad_(False)
    out = {"fsdp": f"FSDP{version}", "case": case}
    try:  # FSDP1 refuses when it flattens (ValueError), FSDP2 at the first forward (AssertionError)
        wrapped = _shard(model, version, own_group=case == "trainable_fp32_and_bf16_own_groups")
        wrapped(torch.randn(2, 8)).sum().backward()
        return {**out, "ok": True, "error": None}
    except (AssertionError, ValueError) as err:
        return {**out, "ok": False, "error": str(err).splitlines()[0]}


def record(out: Path) -> None:
    dist.init_process_group("gloo")
    results = [_try(c, v) for v in (2, 1) for c in CASES]
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "dtype_rule.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    # The failed cases leave FSDP states in reference cycles that hold the process group; freed only at
    # interpreter exit, the gloo group's threads were torn down there and the process aborted now and then
    # ("terminate called without an active exception", SIGABRT after the results were written: 1 run in
    # 5-12 on 2 cores). Collected here, the group is destroyed while Python still runs.
    gc.collect()
    dist.destroy_process_group()


def check_dtype_rule(out_dir: str | Path, timeout: float = 300) -> list[dict]:
    """Run the three cases with FSDP2, then FSDP1 (``use_orig_params=True``), on one gloo process; each result
    is ``{"fsdp", "case", "ok", "error"}`` (error: the first line of FSDP's message, or None). Raises RuntimeError with the output if the launch fails."""
    run_probe("dtype-rule run", "smolfsdp.probes.dtype_rule", ["--out", str(out_dir)], 1, timeout)
    return read_results(out_dir, "dtype_rule.json")


def main() -> None:
    probe_main(record, __doc__)


if __name__ == "__main__":
    main()
