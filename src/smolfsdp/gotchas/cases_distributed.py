"""The gotchas that run on 2 gloo ranks (one ``torchrun`` launch for all of them), failing and fixed.

Chapter "Debugging the seams" (``notebooks/06_gotchas.ipynb``) through ``smolfsdp.gotchas.run_all``, which
launches them; each case registers itself in ``smolfsdp.gotchas.registry.GOTCHAS``.

    smolfsdp gotchas --run tied_embeddings,optimizer_before_sharding
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState
from peft import LoraConfig, get_peft_model
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile
from transformers.models.llama import modeling_llama

from smolfsdp.config import ConfigError, TrainConfig
from smolfsdp.gotchas.builders import decoder_layer_cls, full_tensor, rank_batch, shard_fsdp2, tiny_model
from smolfsdp.gotchas.registry import (
    WRONG,
    attempt,
    gotcha,
)
from smolfsdp.measure.results import RunWriter
from smolfsdp.models.modeling import resolve_wrap_class
from smolfsdp.sharding import fsdp1, fsdp2
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.sharding.fsdp1 import fsdp_units, wrap_fsdp1
from smolfsdp.sharding.fsdp2 import build_mesh
from smolfsdp.sharding.shards import apply_activation_checkpointing
from smolfsdp.traces.classify import collective_kind


def check_wrapping(model: nn.Module, wrap_cls: type[nn.Module] | str) -> int:
    """Number of FSDP units (FSDP1 or FSDP2) in ``model``; raise when the policy wrapped no layer.

    Raises ConfigError when the model has decoder layers (``wrap_cls`` instances) but only the
    root is an FSDP unit: then every step all-gathers the whole model at once and nothing is sharded
    per layer, which no error reveals.
    """

    name = wrap_cls if isinstance(wrap_cls, str) else wrap_cls.__name__
    layers = [m for m in model.modules() if type(m).__name__ in (name, "FSDP" + name)]
    units = len(fsdp1.fsdp_units(model)) + len(fsdp2.fsdp_units(model))
    if layers and units <= 1:
        raise ConfigError(
            f"the wrap policy wrapped none of the {len(layers)} {name} modules: the model has {units} FSDP "
            f"unit (the root). Wrap the class the model really uses (check type(layer).__name__)."
        )
    return units


# ------------------------------------------------------------------------- the gotchas (2 ranks)
@gotcha("fsdp2_mixed_dtensor")
def fsdp2_mixed_dtensor(rank: int, world: int) -> dict[str, Any]:

    ids = rank_batch(rank)["input_ids"]
    model = shard_fsdp2(tiny_model()[0], world)
    failing = attempt(lambda: {"shape": list(model.model(input_ids=ids).last_hidden_state.shape)})
    model = shard_fsdp2(
        tiny_model()[0], world
    )  # the failed call left the first layer's FSDP state initialised

    def unshard_call():
        model.unshard()
        hidden = model.model(input_ids=ids).last_hidden_state
        model.reshard()
        types = sorted({type(p).__name__ for p in model.parameters()})
        return {"shape": list(hidden.shape), "parameter_types_after": types}

    fixed = attempt(unshard_call)
    m1 = wrap_fsdp1(tiny_model()[0], decoder_layer_cls())  # the seed's fix: pin FSDP1
    seed_fix = attempt(lambda: {"shape": list(m1.module.model(input_ids=ids).last_hidden_state.shape)})

    def summon():
        with FSDP.summon_full_params(m1, recurse=False):
            return {"shape": list(m1.module.model(input_ids=ids).last_hidden_state.shape)}

    if seed_fix["outcome"] == "error":
        seed_fix["why"] = "outside the root's forward FSDP1 leaves each parameter as its 1-D shard"
    return {"failing": failing, "fixed": {**fixed, "fsdp1_summon": attempt(summon)}, "seed_fix": seed_fix}


@gotcha("wrap_class")
def wrap_class(rank: int, world: int) -> dict[str, Any]:

    model = tiny_model()[0]
    misspelt = attempt(lambda: {"class": resolve_wrap_class(model, "SmolLM3DecoderLayers").__name__})
    wrong = wrap_fsdp1(tiny_model()[0], modeling_llama.LlamaDecoderLayer)
    units = len(fsdp_units(wrong))
    quiet = {"outcome": "measured", "fsdp_units": units, "decoder_layers": 4}
    if units <= 1:  # nothing raised: say what went wrong instead of "measured"
        quiet.update(
            outcome=WRONG, symptom=f"no decoder layer wrapped: {units} FSDP unit (the root) for 4 layers"
        )
    failing = {
        **quiet,
        "check_wrapping": attempt(lambda: {"units": check_wrapping(wrong, "SmolLM3DecoderLayer")}),
    }
    right = wrap_fsdp1(tiny_model()[0], resolve_wrap_class(model))
    fixed = attempt(lambda: {"fsdp_units": check_wrapping(right, "SmolLM3DecoderLayer")})
    return {"failing": {**failing, "misspelt": misspelt}, "fixed": fixed}


@gotcha("trainer_fsdp_is_ddp")
def trainer_fsdp_is_ddp(rank: int, world: int) -> dict[str, Any]:
    from smolfsdp.train.trl_engine import (
        run_trl,  # deferred: imports trl, the heaviest; only this case needs it
    )

    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = Path(os.environ.get("SMOLFSDP_GOTCHA_OUT") or tempfile.mkdtemp())  # runner._launch sets it
    results = {}
    for label, lifted in (("failing", False), ("fixed", True)):
        cfg = TrainConfig(
            name=f"gotcha-trl-{label}",
            output_dir=str(out),
            engine="trl",
            max_steps=1,
            eval_steps=0,
            save_final_model=False,
            max_rows=32,
            accelerate_fsdp_on_cpu=lifted,
        )
        AcceleratorState._reset_state()  # each Trainer builds its accelerator state afresh (same group)
        writer = RunWriter(cfg.run_dir, enabled=rank == 0)
        try:
            fields = run_trl(cfg, info, writer)
        finally:
            writer.close()
        eff = fields["effective"]
        results[label] = {
            "outcome": "measured",
            "requested": fields["requested"]["strategy"],
            **_effective(eff),
            "fsdp_units": eff["evidence"].get("fsdp_units", 0),
            "parameter_type": eff["evidence"].get("parameter_type", "torch.nn.Parameter (full copy)"),
            "held_per_rank": fields["params"]["fraction_per_rank"][rank],
        }
        if results[label]["strategy"] != results[label]["requested"]:  # trained, silently not as asked
            results[label].update(
                outcome=WRONG, symptom=f"asked for {results[label]['requested']}, ran {eff['strategy']}"
            )
    return results


def _effective(eff: dict[str, Any]) -> dict[str, Any]:
    return {"strategy": eff["strategy"], "wrapper": eff["evidence"]["wrapper"], "reason": eff["reason"]}


@gotcha("gradient_checkpointing")
def gradient_checkpointing(rank: int, world: int) -> dict[str, Any]:

    batch, rows = rank_batch(rank), {}
    for version in (1, 2):
        for mode in ("none", "fsdp_ac", "hf_use_reentrant_false", "hf_use_reentrant_true"):
            model = tiny_model()[0]
            if mode == "fsdp_ac":
                apply_activation_checkpointing(model, decoder_layer_cls())
            elif mode.startswith("hf"):
                kw = {"use_reentrant": mode.endswith("true")}
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            model = wrap_fsdp1(model, decoder_layer_cls()) if version == 1 else shard_fsdp2(model, world)
            model(**batch).loss.backward()  # lazy init outside the profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(**batch).loss.backward()
            # aten::silu runs once per decoder-layer MLP forward: 4 per step, 8 when layers are recomputed
            counts = {"all-gather": 0, "reduce-scatter": 0, "layer_forwards": 0}
            for e in prof.events():
                kind = "layer_forwards" if e.name == "aten::silu" else collective_kind(e.name)
                if kind in counts:
                    counts[kind] += 1
            rows[f"fsdp{version}/{mode}"] = counts
    failing = {k: v for k, v in rows.items() if "/hf_" in k}
    fixed = {k: v for k, v in rows.items() if "/hf_" not in k}
    return {"failing": {"outcome": "measured", **failing}, "fixed": {"outcome": "measured", **fixed}}


@gotcha("tied_embeddings")
def tied_embeddings(rank: int, world: int) -> dict[str, Any]:

    def step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(**rank_batch(rank)).loss.backward()
        opt.step()
        head, emb = model.lm_head.weight, model.model.embed_tokens.weight
        return {
            "same_parameter": head is emb,
            "max_abs_diff": float((full_tensor(head) - full_tensor(emb)).abs().max()),
        }

    def separate():
        model, mesh = tiny_model()[0], build_mesh("cpu", world)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model.lm_head, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return step(model)

    return {"failing": attempt(separate), "fixed": attempt(lambda: step(shard_fsdp2(tiny_model()[0], world)))}


@gotcha("optimizer_before_sharding")
def optimizer_before_sharding(rank: int, world: int) -> dict[str, Any]:
    def run(before: bool):
        model = tiny_model()[0]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2) if before else None
        shard_fsdp2(model, world)
        opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-2)
        start = {n: full_tensor(p).clone() for n, p in model.named_parameters()}
        loss = float(model(**rank_batch(rank)).loss.detach())
        model(**rank_batch(rank)).loss.backward()
        opt.step()
        change = max(float((full_tensor(p) - start[n]).abs().max()) for n, p in model.named_parameters())
        with_grad = sum(p.grad is not None for g in opt.param_groups for p in g["params"])
        return {"max_param_change": change, "optimizer_params_with_grad": with_grad, "loss": round(loss, 4)}

    failing = attempt(run, True)
    if failing["outcome"] == "ok" and failing["max_param_change"] == 0.0:
        # no exception is the whole trap: attempt() says "ok", so name the measured symptom instead
        failing.update(outcome=WRONG, symptom="optimizer.step() ran and no weight changed")
    return {"failing": failing, "fixed": attempt(run, False)}


@gotcha("peft_fp32_adapters_fsdp1")
def peft_fp32_adapters_fsdp1(rank: int, world: int) -> dict[str, Any]:

    def wrap(autocast: bool):
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(tiny_model(dtype=torch.bfloat16)[0], lora, autocast_adapter_dtype=autocast)
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
        return {"dtypes": dtypes, "fsdp_units": len(fsdp_units(wrap_fsdp1(model, decoder_layer_cls())))}

    return {"failing": attempt(wrap, True), "fixed": attempt(wrap, False)}
