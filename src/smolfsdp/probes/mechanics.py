"""What FSDP does during one step, recorded on 2 ranks: sharding, collectives, state dicts, freezing.

Used by the chapters "FSDP mechanics" and "FSDP1 vs FSDP2". ``measure_mechanics`` launches this
module with torchrun (a subprocess; never a process group in the notebook kernel); each rank
wraps the tiny SmolLM3 with FSDP1 or FSDP2, profiles one training step with torch.profiler
(the ``FSDP::*`` ranges FSDP2 annotates and the c10d collectives both versions issue), times a few
steps, inspects a sharded state dict, and tries freezing a single parameter.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m smolfsdp.probes.mechanics \\
        --fsdp-version 2 --out runs/mechanics
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp._flat_param import FlatParameter
from torch.profiler import ProfilerActivity, profile
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from smolfsdp.launch.probe import probe_main, read_results, run_probe
from smolfsdp.models.modeling import (
    build_meta_model,
    build_model,
    count_parameters,
    load_tokenizer,
    resolve_wrap_class,
)
from smolfsdp.sharding.distributed import init_distributed, teardown
from smolfsdp.sharding.fsdp1 import wrap_fsdp1
from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh, describe_sharding
from smolfsdp.sharding.shards import local_tensors, storage_bytes
from smolfsdp.traces.classify import collective_kind
from smolfsdp.train.steps import forward_backward


def _wrap(model: nn.Module, version: int, world: int, use_orig_params: bool = True) -> nn.Module:
    wrap_cls = resolve_wrap_class(model)
    if version == 1:
        return wrap_fsdp1(model, wrap_cls, device=torch.device("cpu"), use_orig_params=use_orig_params)
    return apply_fsdp2(model, build_mesh("cpu", world), wrap_cls)


def _events(prof, t0: float) -> list[dict[str, Any]]:
    out = []
    for e in prof.events():
        kind = "annotation" if e.name.startswith("FSDP::") else collective_kind(e.name)
        if kind is None:
            continue
        out.append(
            {
                "name": e.name,
                "kind": kind,
                "start_us": e.time_range.start - t0,
                "dur_us": e.time_range.end - e.time_range.start,
            }
        )
    return sorted(out, key=lambda r: r["start_us"])


def _state_dict_facts(model: nn.Module, version: int) -> dict[str, Any]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if version == 1:
            with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
                sd = model.state_dict()
        else:
            sd = model.state_dict()
    key = next(k for k in sd if k.endswith("q_proj.weight"))
    value = sd[key]
    local = value.local_tensor() if hasattr(value, "local_tensor") else value.to_local()
    comms = [e.name for e in prof.events() if collective_kind(e.name)]
    return {
        "value_type": type(value).__name__,
        "example_key": key,
        "global_shape": list(value.shape),
        "local_shape": list(local.shape),
        "collectives": len(comms),
        "collective_ops": sorted(set(comms)),
    }


def _freeze_one(version: int, world: int, use_orig_params: bool) -> dict[str, Any]:
    """Freeze layer 0's q_proj.weight only, wrap, and take a step: does FSDP accept it?"""
    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    model.model.layers[0].self_attn.q_proj.weight.requires_grad_(False)
    try:
        model = _wrap(model, version, world, use_orig_params)
        _one_step(model, tok, world)
        return {"ok": True, "error": None}
    except Exception as err:  # the point of this probe is to show the error FSDP raises
        return {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}


def _batch(tok):
    ids = list(range(1, 65))
    return DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
        [{"input_ids": ids, "labels": ids}] * 2
    )


def _one_step(model: nn.Module, tok, world: int) -> float:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loss, _ = forward_backward(model, [_batch(tok)], world, torch.device("cpu"))
    opt.step()
    opt.zero_grad()
    return loss


def record(version: int, out_dir: Path, steps: int = 5) -> dict[str, Any]:
    """Body of one rank (inside torchrun): measure everything and write ``fsdp{v}_rank{r}.json``."""
    info = init_distributed()
    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    units = {"root": count_parameters(model) - sum(count_parameters(m) for m in model.model.layers)}
    units.update({f"model.layers.{i}": count_parameters(m) for i, m in enumerate(model.model.layers)})
    full_bytes = storage_bytes(model.parameters())
    model = _wrap(model, version, info.world_size)
    table = describe_sharding(model) if version == 2 else describe_flat_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        forward_backward(model, [_batch(tok)], info.world_size, info.device)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state exists from here on
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    start = min(e.time_range.start for e in prof.events())
    opt_bytes = storage_bytes(
        [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    )
    result = {
        "fsdp_version": version,
        "rank": info.rank,
        "world_size": info.world_size,
        "unit_params": units,
        "full_param_bytes": full_bytes,
        "param_bytes": storage_bytes(local_tensors(model)),
        "optimizer_bytes": opt_bytes,
        "step_ms": step_ms,
        "sharding": table.to_dict(orient="records"),
        "events": _events(prof, start),
        "state_dict": _state_dict_facts(model, version),
        "freeze_one_param": {
            "use_orig_params=True" if version == 1 else "per-parameter": _freeze_one(
                version, info.world_size, True
            )
        },
    }
    if version == 1:
        result["freeze_one_param"]["use_orig_params=False"] = _freeze_one(version, info.world_size, False)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"fsdp{version}_rank{info.rank}.json").write_text(json.dumps(result, default=str))
    teardown()
    return result


def describe_flat_parameters(model: nn.Module) -> pd.DataFrame:
    """FSDP1: one row per FlatParameter (one per FSDP unit): local and unpadded global numel."""
    rows = []
    for name, unit in model.named_modules():
        flat = getattr(unit, "_flat_param", None) if isinstance(unit, FullyShardedDataParallel) else None
        if flat is None:
            continue
        full = flat._unpadded_unsharded_size.numel()
        fqn = name.replace("_fsdp_wrapped_module.", "").removesuffix("._fsdp_wrapped_module") or "<root>"
        # FlatParameter's metaclass makes type(flat) print as Parameter; isinstance tells the truth
        kind = "FlatParameter" if isinstance(flat, FlatParameter) else type(flat).__name__
        rows.append(
            {
                "name": fqn,
                "type": kind,
                "placement": "flat 1-D shard",
                "local_shape": tuple(flat.shape),
                "global_shape": (full,),
                "local_numel": flat.numel(),
                "global_numel": full,
                "padding": flat.numel() * dist.get_world_size() - full,
                "original_params": len(flat._fqns),
                "dtype": str(flat.dtype).replace("torch.", ""),
                "requires_grad": flat.requires_grad,
            }
        )
    return pd.DataFrame(rows)


def measure_mechanics(
    fsdp_version: int, out_dir: str | Path, nproc: int = 2, timeout: float = 600
) -> list[dict]:
    """Launch :func:`record` on ``nproc`` CPU processes and return each rank's result (by rank)."""
    args = ["--fsdp-version", str(fsdp_version), "--out", str(out_dir)]
    run_probe("mechanics run", "smolfsdp.probes.mechanics", args, nproc, timeout)
    return read_results(out_dir, f"fsdp{fsdp_version}_rank{{rank}}.json", nproc)


def main() -> None:
    version = {"type": int, "choices": [1, 2], "required": True}
    probe_main(lambda out, fsdp_version: record(fsdp_version, out), __doc__, fsdp_version=version)


if __name__ == "__main__":
    main()


def fsdp_unit_table(model: str = "tiny", world_size: int = 2, bytes_per_param: int = 4) -> pd.DataFrame:
    """The seed's worked example, computed: FSDP units of ``model`` (root + each decoder layer).

    Built on the meta device (no weights). Per unit: parameters; full bytes; the shard each rank
    keeps, ``ceil(n / world_size) * bytes`` (FSDP pads to a multiple of the world size); and the
    parameter bytes a rank holds while that unit computes in forward: every shard, plus this unit
    and the next one gathered in full (the current unit and the prefetched one), plus the root, which
    is gathered first and stays gathered through the whole forward (its forward spans the model: the
    embedding runs first, the tied ``lm_head`` last).
    """
    tok = load_tokenizer("tiny") if model == "tiny" else None
    net = build_meta_model(model, tok)
    layers = list(net.model.layers)
    counts = {
        "root (embeddings, final norm, tied lm_head)": count_parameters(net)
        - sum(count_parameters(m) for m in layers)
    }
    counts.update({f"model.layers.{i}": count_parameters(m) for i, m in enumerate(layers)})
    df = pd.DataFrame({"unit": list(counts), "parameters": list(counts.values())})
    df["full_bytes"] = df["parameters"] * bytes_per_param
    df["shard_bytes_per_rank"] = [math.ceil(n / world_size) * bytes_per_param for n in df["parameters"]]
    all_shards = int(df["shard_bytes_per_rank"].sum())
    unsharded_extra = list(df["full_bytes"] - df["shard_bytes_per_rank"])  # what gathering a unit adds
    root_extra = unsharded_extra[0]  # row 0 is the root
    df["held_while_computing_bytes"] = [
        all_shards + unsharded_extra[i] + (unsharded_extra[i + 1] if i + 1 < len(df) else 0)
        + (root_extra if i > 0 else 0)
        for i in range(len(df))
    ]  # fmt: skip
    return df.set_index("unit")
