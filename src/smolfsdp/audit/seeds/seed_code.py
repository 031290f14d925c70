"""The seeds' code run as written, on the tiny SmolLM3 and 2 gloo ranks, beside the package's version.

Used by the chapter "What the seeds say, and what we measured" (``notebooks/08_seed_claims.ipynb``) through
:func:`run_seed_code`, which launches this module with torchrun (never a process group in the notebook kernel)
and caches the JSON it writes, so a test and the chapter in one session launch it once. Each rank:

* builds seed 2's LoRA set-up step by step as the seed orders it (gradient checkpointing before
  ``get_peft_model``, the whole model cast to bf16, every parameter frozen, then each name containing "lora"
  unfrozen; ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``, ``OffloadPolicy()``), shards it
  with ``fully_shard`` per layer of the class the seed names (``LlamaDecoderLayer``) and of SmolLM3's own class,
  and takes two steps: how many FSDP groups, how much of the model the root group gathers at once, which
  adapters receive a non-zero gradient;
* repeats the SmolLM3 form with an fp32 reduction and with everything fp32, to measure what the bf16
  reduction costs in gradient error;
* builds the package's version (``smolfsdp.sharding.lora.apply_lora`` with fp32 adapters on a bf16 base,
  ``smolfsdp.sharding.fsdp2.apply_fsdp2`` with a bf16 compute, fp32 reduce policy);
* counts the collectives ``state_dict()`` issues under FSDP2 and under FSDP1's ``SHARDED_STATE_DICT``
  (seed 2: FSDP2's sharded state dict needs no communication, FSDP1's does);
* counts the all-gathers per FSDP unit in one full fine-tune step (seed 1: twice per layer per step) and
  saves that step's model and AdamW state as a DCP checkpoint, whose bytes on disk it measures.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m smolfsdp.audit.seeds.seed_code --out OUT
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from peft import LoraConfig, get_peft_model
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, StateDictType, fully_shard
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile
from transformers.models.llama import modeling_llama
from transformers.models.smollm3.modeling_smollm3 import SmolLM3DecoderLayer

from smolfsdp.checkpoint.disk import estimate_checkpoint_bytes
from smolfsdp.config import TrainConfig
from smolfsdp.gotchas.builders import full_tensor, rank_batch, tiny_model
from smolfsdp.launch.probe import probe_main, read_results, run_probe
from smolfsdp.measure.results import RunWriter
from smolfsdp.probes.step import unit_of
from smolfsdp.sharding import fsdp2
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.sharding.fsdp1 import wrap_fsdp1
from smolfsdp.sharding.lora import apply_lora
from smolfsdp.traces.classify import collective_kind

RESULT = "seed_code.json"
WRAP = {"LlamaDecoderLayer": modeling_llama.LlamaDecoderLayer, "SmolLM3DecoderLayer": SmolLM3DecoderLayer}
_CACHE: dict[str, dict[str, Any]] = {}


def _seed2_model(
    wrap: str,
    world: int,
    reduce_dtype: torch.dtype,
    dtype: torch.dtype,
    reentrant: bool | None = None,
    hooks: bool = True,
) -> tuple[nn.Module, dict]:
    """Seed 2's set-up in the seed's order (``dtype`` bf16 as written; fp32 for the reference run).
    ``reentrant``: ``use_reentrant`` of the checkpointing (None: transformers' default); ``hooks=False``
    removes the input-gradient hook transformers and peft install (the control)."""
    model = tiny_model()[0].to(dtype)  # the seed loads in bf16 (torch_dtype=torch.bfloat16)
    model.config.use_cache = False
    ckpt = None if reentrant is None else {"use_reentrant": reentrant}
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs=ckpt
    )  # before get_peft_model, as the seed
    torch.manual_seed(1)  # the adapters' initial values: the same in every form
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "k_proj", "o_proj"],
                      lora_dropout=0.05, bias="none", task_type="CAUSAL_LM")  # fmt: skip
    model = get_peft_model(model, lora).to(dtype)  # the seed's cast of the whole model, adapters included
    emb = model.get_input_embeddings()
    grad_hooks = [k for k, h in emb._forward_hooks.items() if "require_grads" in getattr(h, "__name__", "")]
    if not hooks:  # the control: neither transformers' nor peft's hook
        for k in grad_hooks:
            del emb._forward_hooks[k]
    for p in model.parameters():
        p.requires_grad = False
    for name, p in model.named_parameters():
        if "lora" in name.lower():
            p.requires_grad = True
    cls = WRAP[wrap]
    total = sum(p.numel() for p in model.parameters())
    in_layers = sum(p.numel() for m in model.modules() if isinstance(m, cls) for p in m.parameters())
    mesh = init_device_mesh("cpu", (world,))
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16 if dtype == torch.bfloat16 else None,
                                            reduce_dtype=reduce_dtype),
          "offload_policy": OffloadPolicy()}  # fmt: skip
    for module in model.modules():
        if isinstance(module, cls):
            fully_shard(module, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    left = sum("require_grads" in getattr(h, "__name__", "") for h in emb._forward_hooks.values())
    return model, {"root_group_share": (total - in_layers) / total, "input_grad_hooks": len(grad_hooks),
                   "input_grad_hooks_left": left}  # fmt: skip


def _two_steps(model: nn.Module, rank: int) -> dict[str, Any]:
    """Two forward/backward passes with an AdamW step between; the adapters' gradients of the second.

    At the first step every ``lora_B`` is zero (peft's initialisation), so every ``lora_A`` gradient is zero
    by construction; the second step is the one that shows whether gradients reach both."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    for step in range(2):
        torch.manual_seed(10 + step)  # the same dropout masks in every form
        loss = model(**rank_batch(rank)).loss
        loss.backward()
        if step == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    grads = {
        n: full_tensor(p.grad).float()
        for n, p in model.named_parameters()
        if p.requires_grad and p.grad is not None
    }
    adapters = [n for n, p in model.named_parameters() if "lora" in n.lower()]
    return {
        "loss": float(loss.detach().float()),
        "adapters": len(adapters),
        "adapters_trainable": sum(p.requires_grad for n, p in model.named_parameters() if "lora" in n.lower()),
        "adapters_with_grad": len(grads),
        "adapters_nonzero_grad": sum(bool(g.abs().sum() > 0) for g in grads.values()),
        "adapter_dtypes": sorted({str(p.dtype).removeprefix("torch.") for n, p in model.named_parameters() if "lora" in n.lower()}),
        "grad_dtypes": sorted({str(p.grad.dtype).removeprefix("torch.") for p in trainable if p.grad is not None}),
        "fsdp_units": len(fsdp2.fsdp_units(model)),
        "plain_tensor_params": sum(not isinstance(p, DTensor) for p in model.parameters()),
        "_grads": grads,
    }  # fmt: skip


def _rel_error(a: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    num = sum(float((a[n] - ref[n]).pow(2).sum()) for n in ref) ** 0.5
    den = sum(float(ref[n].pow(2).sum()) for n in ref) ** 0.5
    return {"relative_l2": num / den, "max_abs": max(float((a[n] - ref[n]).abs().max()) for n in ref)}


def seed2_as_written(rank: int, world: int) -> dict[str, Any]:
    bf16, fp32 = torch.bfloat16, torch.float32
    runs = {
        "seed, LlamaDecoderLayer": _seed2_model("LlamaDecoderLayer", world, bf16, bf16),
        "seed, SmolLM3DecoderLayer": _seed2_model("SmolLM3DecoderLayer", world, bf16, bf16),
        "seed, SmolLM3DecoderLayer, fp32 reduce": _seed2_model("SmolLM3DecoderLayer", world, fp32, bf16),
        "all fp32 (reference)": _seed2_model("SmolLM3DecoderLayer", world, fp32, fp32),
    }
    out = {label: {**facts, **_two_steps(model, rank)} for label, (model, facts) in runs.items()}
    ours = tiny_model(dtype=bf16)[0]
    torch.manual_seed(1)
    ours = apply_lora(ours, TrainConfig(lora=True))  # fp32 adapters on the bf16 base (peft's default)
    fsdp2.apply_fsdp2(ours, fsdp2.build_mesh("cpu", world), SmolLM3DecoderLayer,
                      mp_policy=fsdp2.default_mp_policy("bf16"))  # fmt: skip
    out["package: apply_lora + apply_fsdp2"] = {"root_group_share": None, **_two_steps(ours, rank)}
    ref = out["all fp32 (reference)"]["_grads"]
    for row in out.values():
        grads = row.pop("_grads")
        row["grad_error_vs_fp32"] = _rel_error(grads, ref) if set(grads) == set(ref) else None
    return out


def checkpointing_forms(rank: int, world: int) -> dict[str, Any]:
    """Seed 2's SmolLM3 form with reentrant checkpointing, with and without the input-gradient hooks:
    which one cuts the adapters off?"""
    bf16 = torch.bfloat16
    runs = {
        "default checkpointing": _seed2_model("SmolLM3DecoderLayer", world, bf16, bf16),
        "use_reentrant=False": _seed2_model("SmolLM3DecoderLayer", world, bf16, bf16, reentrant=False),
        "use_reentrant=True": _seed2_model("SmolLM3DecoderLayer", world, bf16, bf16, reentrant=True),
        "use_reentrant=True, hooks removed": _seed2_model(
            "SmolLM3DecoderLayer", world, bf16, bf16, reentrant=True, hooks=False
        ),  # fmt: skip
    }
    out = {}
    for label, (model, facts) in runs.items():
        try:
            row = _two_steps(model, rank)
            row.pop("_grads")
            out[label] = {**facts, **row, "error": None}
        except RuntimeError as err:  # the control: no gradient reaches anything, backward refuses
            n = sum("lora" in name.lower() for name, _ in model.named_parameters())
            out[label] = {
                **facts,
                "adapters": n,
                "adapters_nonzero_grad": 0,
                "error": str(err).splitlines()[0],
            }
    return out


def meta_init(rank: int, world: int) -> dict[str, Any]:
    """Seed 2's "simpler meta-device initialisation": the tiny SmolLM3 built on the meta device, sharded
    with FSDP2 as it is, then ``to_empty`` + the model's own ``init_weights`` and one forward/backward; and
    FSDP1 on the same meta model with no ``param_init_fn`` (what it does without one)."""
    from transformers import AutoConfig, AutoModelForCausalLM  # deferred: only this part builds from a config

    config = tiny_model()[0].config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config.to_dict()))
    fsdp2.apply_fsdp2(model, fsdp2.build_mesh("cpu", world), SmolLM3DecoderLayer)
    on_meta = sum(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    loss = model(**rank_batch(rank)).loss
    loss.backward()
    out = {"fsdp2": {"params_on_meta_after_shard": on_meta, "calls_after_shard": ["to_empty", "init_weights"],
                     "loss": float(loss.detach()), "finite": bool(torch.isfinite(loss)),
                     "dtensor_params": sum(isinstance(p, DTensor) for p in model.parameters()),
                     "params": sum(1 for _ in model.parameters())}}  # fmt: skip
    with torch.device("meta"):
        meta1 = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config.to_dict()))
    try:
        v1 = wrap_fsdp1(meta1, SmolLM3DecoderLayer)
        still_meta = sum(p.is_meta for p in v1.parameters())
        out["fsdp1"] = {"outcome": "wrapped", "params_on_meta": still_meta}
    except Exception as err:  # FSDP1 needs param_init_fn or materialised weights: recorded, not hidden
        out["fsdp1"] = {"outcome": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
    return out


def _count(fn) -> tuple[Any, dict[str, int]]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        value = fn()
    return value, dict(Counter(k for e in prof.events() if (k := collective_kind(e.name))))


def state_dict_collectives(world: int) -> dict[str, dict[str, int]]:
    """Collectives each state-dict call issues, by kind (c10d ops in torch.profiler), on this rank."""
    v2 = fsdp2.apply_fsdp2(tiny_model()[0], fsdp2.build_mesh("cpu", world), SmolLM3DecoderLayer)
    v1 = wrap_fsdp1(tiny_model()[0], SmolLM3DecoderLayer)

    def fsdp1_sharded():
        with FSDP.state_dict_type(v1, StateDictType.SHARDED_STATE_DICT):
            return v1.state_dict()

    def fsdp1_full():
        with FSDP.state_dict_type(v1, StateDictType.FULL_STATE_DICT):
            return v1.state_dict()

    return {
        "FSDP2 model.state_dict()": _count(v2.state_dict)[1],
        "FSDP2 get_model_state_dict()": _count(lambda: get_model_state_dict(v2))[1],
        "FSDP1 SHARDED_STATE_DICT": _count(fsdp1_sharded)[1],
        "FSDP1 get_model_state_dict()": _count(lambda: get_model_state_dict(v1))[1],
        "FSDP1 FULL_STATE_DICT": _count(fsdp1_full)[1],
    }


def full_step_and_checkpoint(rank: int, world: int, out: Path) -> dict[str, Any]:
    """All-gathers per FSDP unit over one full fine-tune step (FSDP2, the package's wrap); then a DCP
    checkpoint of the model and AdamW state, its bytes on disk beside ``estimate_checkpoint_bytes``."""
    model = tiny_model()[0]
    estimate = estimate_checkpoint_bytes(model)
    params = sum(p.numel() for p in model.parameters())
    fsdp2.apply_fsdp2(model, fsdp2.build_mesh("cpu", world), SmolLM3DecoderLayer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(**rank_batch(rank)).loss.backward()  # lazy initialisation outside the profile
    opt.step()
    opt.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(**rank_batch(rank)).loss.backward()
        opt.step()
    names = [e.name for e in prof.events()]
    gathers = Counter(
        unit_of(n) for n in names if n.startswith("FSDP::all_gather (") or n == "FSDP::all_gather"
    )
    reduces = Counter(unit_of(n) for n in names if n.startswith("FSDP::post_backward_reduce"))
    local = sum(p.to_local().numel() for p in model.parameters())
    ckpt = out / "dcp_checkpoint"
    dcp.save(
        {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
        checkpoint_id=str(ckpt),
    )
    dist.barrier()
    on_disk = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    return {
        "layers": len(model.model.layers),
        "all_gathers_per_unit": dict(gathers),
        "reduce_scatters_per_unit": dict(reduces),
        "c10d_all_gathers": sum(collective_kind(n) == "all-gather" for n in names),
        "c10d_reduce_scatters": sum(collective_kind(n) == "reduce-scatter" for n in names),
        "local_param_fraction": local / params,
        "params": params,
        "checkpoint_bytes_on_disk": on_disk,
        "checkpoint_bytes_estimate": estimate,
        "checkpoint_files": sorted(f.name for f in ckpt.iterdir()),
    }  # fmt: skip


def trainer_fsdp2_eval(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Seed 1's gotcha 1 on the Trainer's FSDP2 path: SFTTrainer, FSDP2, the tiny SmolLM3 (tied embeddings),
    activation checkpointing, an evaluation after every step and a checkpoint every second one (the seed's
    "eval/checkpoint cycle"), four steps; did training go on after the first evaluation and the first save?"""
    from accelerate.state import AcceleratorState  # deferred: only this form builds a Trainer

    from smolfsdp.train.trl_engine import run_trl  # deferred: imports trl, the heaviest

    cfg = TrainConfig(name="seed1-fsdp2-eval", output_dir=str(out), engine="trl", fsdp_version=2, max_steps=4,
                      eval_steps=1, save_steps=2, save_total_limit=2, activation_checkpointing=True,
                      save_final_model=False, max_rows=64, per_device_train_batch_size=2,
                      per_device_eval_batch_size=2, eval_on_start=False, accelerate_fsdp_on_cpu=True)  # fmt: skip
    AcceleratorState._reset_state()
    writer = RunWriter(cfg.run_dir, enabled=rank == 0)
    try:
        fields = run_trl(cfg, DistInfo(rank, world, rank, torch.device("cpu"), "gloo"), writer)
    except Exception as err:  # the seed's symptom would be a RuntimeError here: recorded, not hidden
        return {"outcome": "error", "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    finally:
        writer.close()
    rows = [
        json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    model = tiny_model()[0]
    saved = sorted(
        int(p.parent.name.split("-")[-1]) for p in (cfg.run_dir / "checkpoints").glob("step-*/COMPLETE")
    )
    return {
        "outcome": "ok",
        "activation_checkpointing": fields["effective"].get("activation_checkpointing", cfg.activation_checkpointing),
        "checkpoints_saved_at": saved,
        "train_steps_after_first_save": sum(r.get("split") == "train" and r.get("step", 0) > (saved or [99])[0]
                                            for r in rows),  # fmt: skip
        "strategy": fields["effective"]["strategy"],
        "steps": fields["metrics"]["steps"],
        "evaluations": sum(r.get("split") == "eval" for r in rows),
        "train_steps_after_first_eval": sum(r.get("split") == "train" and r.get("step", 0) > 1 for r in rows),
        "tied_embeddings": model.lm_head.weight is model.model.embed_tokens.weight,
        **{k: fields["metrics"][k] for k in ("train_loss_first", "train_loss_last", "eval_loss_first", "eval_loss_last")},
    }  # fmt: skip


def record(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = {
        "seed2": lambda: seed2_as_written(rank, world),
        "seed2_checkpointing": lambda: checkpointing_forms(rank, world),
        "state_dict_collectives": lambda: state_dict_collectives(world),
        "full_step": lambda: full_step_and_checkpoint(rank, world, out),
        "meta_init": lambda: meta_init(rank, world),
        "trainer_fsdp2_eval": lambda: trainer_fsdp2_eval(rank, world, out),
    }
    result: dict[str, Any] = {"world_size": world, "seconds": {}}
    for name, part in parts.items():
        t0 = time.perf_counter()
        result[name] = part()
        result["seconds"][name] = round(time.perf_counter() - t0, 1)
    if rank == 0:
        (out / RESULT).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


def run_seed_code(out_dir: str | Path, timeout: float = 600) -> dict[str, Any]:
    """Launch :func:`record` on 2 gloo ranks (once per ``out_dir`` and process: the result is cached) and
    return rank 0's result. Raises RuntimeError with the ranks' output if the launch fails."""
    out_dir = Path(out_dir)
    key = str(out_dir.resolve())
    if key not in _CACHE:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not (out_dir / RESULT).is_file():
            run_probe("seed-code run", "smolfsdp.audit.seeds.seed_code", ["--out", str(out_dir)], 2, timeout)
        _CACHE[key] = read_results(out_dir, RESULT)
    return _CACHE[key]


def main() -> None:
    probe_main(record, __doc__)


if __name__ == "__main__":
    main()
