"""Measure the bytes that FSDP training state really occupies on each rank (chapter "Where the memory goes").

After one optimizer step on the tiny SmolLM3, count the storages of the parameter shards, the
gradient shards and the AdamW state that exist on the rank, each storage once (views of a
``FlatParameter`` or of FSDP2's reduce-scatter output share one storage). ``smolfsdp.estimate.memory``
estimates the same numbers from the config alone; the test and the chapter put them side by side.

    torchrun --standalone --nproc-per-node 2 scripts/measure_memory.py --out /tmp/measured.json
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding.fsdp1 import wrap_fsdp1
from smolfsdp.sharding.fsdp2 import apply_fsdp2

#: The cases the chapter and the test measure: engine x (full fine-tune | LoRA) x parameter dtype.
#: ``mixed`` = fp32 parameters with bf16 compute (FSDP1 ``MixedPrecision`` / FSDP2
#: ``MixedPrecisionPolicy``), which is what HF Trainer + FSDP with ``bf16=True`` keeps.
CASES: tuple[tuple[int, bool, str], ...] = tuple(
    (v, lora, p) for v in (1, 2) for lora in (False, True) for p in ("fp32", "bf16", "mixed")
)

#: Which estimator recipe each measured parameter dtype corresponds to.
RECIPE_OF = {"fp32": "fp32", "bf16": "pure-bf16", "mixed": "hf-fsdp-bf16"}

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class Measured:
    """Bytes of the storages one rank holds after one optimizer step (``step`` scalars apart)."""

    fsdp_version: int
    lora: bool
    params: str
    rank: int
    world_size: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    optimizer_step_bytes: int
    n_step_tensors: int

    @property
    def static_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def storage_bytes(tensors, seen: set[int] | None = None) -> int:
    """Sum of ``untyped_storage().nbytes()`` over ``tensors``, each storage counted once.

    ``seen`` (storage data pointers) is updated, so several calls never count a storage twice.
    Tensors whose storage has been freed (resized to 0, as FSDP does with unsharded buffers) add 0.
    """
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None:
            continue
        s = _local(t).untyped_storage()
        if s.nbytes() == 0 or s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def count_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes that exist on this rank now.

    FSDP1: the ``FlatParameter`` shards (with ``use_orig_params`` the original parameters are views
    into them, so they add nothing). FSDP2: each ``DTensor``'s padded local storage. AdamW's
    ``exp_avg``/``exp_avg_sq`` are counted; its ``step`` counters are reported apart: torch keeps
    them as 0-d fp32 tensors on the host unless ``capturable``/``fused`` is set, so they are never
    device memory (and are 4 bytes per parameter tensor).
    """
    params = list(model.parameters())
    flat = [u._flat_param for u in FSDP.fsdp_modules(model) if getattr(u, "_flat_param", None) is not None]
    seen: set[int] = set()
    param_bytes = storage_bytes(flat + params, seen)
    grad_bytes = storage_bytes([p.grad for p in flat + params], seen)
    opt_bytes, step_bytes, n_steps = 0, 0, 0
    for state in optimizer.state.values():
        opt_bytes += storage_bytes([state.get("exp_avg"), state.get("exp_avg_sq")], seen)
        if "step" in state:
            step = state["step"]
            assert step.dim() == 0, "AdamW step counters are scalars"
            step_bytes += step.untyped_storage().nbytes()
            n_steps += 1
    return {
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": opt_bytes,
        "optimizer_step_bytes": step_bytes,
        "n_step_tensors": n_steps,
    }


def _build_case(fsdp_version: int, lora: bool, params: str, world_size: int):
    """The tiny model, optionally with LoRA (peft), sharded as asked, with its AdamW optimizer."""
    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0, dtype=torch.bfloat16 if params == "bf16" else None)
    wrap = resolve_wrap_class(model)
    if lora:
        from peft import LoraConfig, get_peft_model  # deferred: peft is needed by LoRA runs only

        # peft upcasts adapters to fp32 by default; FSDP1 cannot flatten a bf16 base with fp32
        # adapters into one FlatParameter, so a bf16 model keeps bf16 adapters.
        model = get_peft_model(
            model,
            LoraConfig(r=8, lora_alpha=16, target_modules=list(LORA_TARGETS)),
            autocast_adapter_dtype=params != "bf16",
        )
    compute = torch.bfloat16 if params == "mixed" else None
    if fsdp_version == 1:
        model = wrap_fsdp1(model, wrap, device=torch.device("cpu"), param_dtype=compute)
    else:
        mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32) if compute else None
        apply_fsdp2(model, init_device_mesh("cpu", (world_size,)), wrap, mp_policy=mp)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return tok, model, torch.optim.AdamW(trainable, lr=1e-3)


def measure_case(rank: int, world_size: int, fsdp_version: int, lora: bool, params: str) -> Measured:
    """Build, shard, run one forward/backward/``optimizer.step()`` (grads kept), count this rank's bytes.

    Must run inside an initialised process group (gloo or NCCL) of ``world_size`` ranks.
    """
    tok, model, opt = _build_case(fsdp_version, lora, params, world_size)
    torch.manual_seed(rank)
    ids = torch.randint(0, len(tok), (2, 32))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()  # no zero_grad: the gradients of the step are part of the steady state
    counts = count_state_bytes(model, opt)
    return Measured(fsdp_version, lora, params, rank, world_size, **counts)


def measure_all(rank: int, world_size: int, cases=CASES) -> list[dict]:
    """Every case in turn on this rank; a list of ``Measured`` as dicts (picklable, JSON-ready)."""
    return [asdict(measure_case(rank, world_size, *case)) for case in cases]


def compare_with_estimate(rows: list[dict]):
    """One row per measured (case, rank) with the estimator's bytes beside it and the relative error.

    ``rows``: what ``measure_all`` returned on every rank (or ``scripts/measure_memory.py`` wrote).
    """
    import pandas as pd  # deferred: only the tables need pandas

    out = []
    for m in rows:
        est = estimate_memory(
            "tiny", world_size=m["world_size"], rank=m["rank"], fsdp_version=m["fsdp_version"],
            recipe=RECIPE_OF[m["params"]], lora=m["lora"], seq_len=32,
        )  # fmt: skip
        measured = m["param_bytes"] + m["grad_bytes"] + m["optimizer_bytes"]
        out.append(
            {
                "case": f"FSDP{m['fsdp_version']} {'LoRA' if m['lora'] else 'full'} {m['params']}",
                "rank": m["rank"],
                "measured_params": m["param_bytes"],
                "estimated_params": est.params_bytes,
                "measured_grads": m["grad_bytes"],
                "estimated_grads": est.grads_bytes,
                "measured_optimizer": m["optimizer_bytes"],
                "estimated_optimizer": est.optimizer_bytes,
                "measured_static": measured,
                "estimated_static": est.static_bytes,
                "rel_error": (est.static_bytes - measured) / measured,
            }
        )
    return pd.DataFrame(out)
