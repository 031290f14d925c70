"""The seeds' claims that a run on 2 gloo ranks settles, judged from :func:`smolfsdp.audit.seeds.code.run_seed_code`,
and the tables of the chapter's section "The seeds' code as written".

Used by ``smolfsdp.audit.seeds.claims`` (chapter "What the seeds say, and what we measured"). Each function takes
the probe's result (``seed_code``: a dict, rank 0's view) and computes nothing by hand.

    python -c "from smolfsdp.audit.seeds.code import run_seed_code as r; from smolfsdp.audit.seeds.claims_runs \\
        import seed2_table as t; print(t(r('/tmp/seed-code')))"
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import torch

from smolfsdp.audit.seeds.claims_core import SEED1, SEED2, Judgement, gb, gib
from smolfsdp.audit.seeds.claims_seed1 import CONFIG, GOTCHA2, SEED_FSDP_ARG, SEED_FSDP_CONFIG
from smolfsdp.audit.seeds.installed_stack import source_line
from smolfsdp.checkpoint.disk import estimate_checkpoint_bytes
from smolfsdp.config import load_config
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.paths import recipe

SEED_FORM, OWN_CLASS, FP32_REDUCE, REFERENCE, PACKAGE = (
    "seed, LlamaDecoderLayer", "seed, SmolLM3DecoderLayer", "seed, SmolLM3DecoderLayer, fp32 reduce",
    "all fp32 (reference)", "package: apply_lora + apply_fsdp2",
)  # fmt: skip


def gathers_per_layer(seed_code: dict) -> Judgement:
    f = seed_code["full_step"]
    per = f["all_gathers_per_unit"]
    layers = {k: v for k, v in per.items() if k != "root"}
    twice = set(layers.values()) == {2} and len(layers) == f["layers"]
    return Judgement(
        "gathers_per_layer", SEED1, "§3 and §6.1", "all-gathers per layer per step",
        "Each layer's weights are gathered twice per step, once before forward and once before backward, "
        "because FSDP frees them after forward; gradients are reduce-scattered back to shards.",
        "holds" if twice else "wrong",
        [f"One full fine-tune step of the tiny SmolLM3 ({f['layers']} decoder layers, FSDP2, 2 gloo ranks), "
         f"`FSDP::all_gather` ranges per unit: {per}; reduce-scatters per unit: {f['reduce_scatters_per_unit']}; "
         f"c10d all-gathers in the step: {f['c10d_all_gathers']}, reduce-scatters: {f['c10d_reduce_scatters']}."],
        f"Right for the decoder layers. The root group (embedding, final norm, tied `lm_head`) is gathered "
        f"{per.get('root', 0)} time(s): the package keeps it gathered from forward to backward, because backward "
        "needs it first (`smolfsdp.sharding.fsdp2.apply_fsdp2`). A CPU run counts the gathers; whether they "
        "overlap compute needs a GPU trace (the open claim below).",
        {"all_gathers_per_unit": per, "reduce_scatters_per_unit": f["reduce_scatters_per_unit"]},
    )  # fmt: skip


def shards_everything(seed_code: dict) -> Judgement:
    f = seed_code["full_step"]
    world = seed_code["world_size"]
    return Judgement(
        "shards_everything", SEED2, "how FSDP works", "what each rank keeps",
        "FSDP splits the parameters, gradients and optimizer state across the GPUs instead of copying them, "
        "and each rank keeps only its own shard.",
        "holds" if abs(f["local_param_fraction"] - 1 / world) < 0.01 else "partly",
        [f"On {world} gloo ranks, rank 0 holds {f['local_param_fraction']:.1%} of the tiny model's "
         f"{f['params']:,} parameters after `fully_shard`; its AdamW state is built on those shards (the DCP "
         f"checkpoint below writes one file per rank: {', '.join(f['checkpoint_files'])})."],
        "Right. Memory per rank still holds one or two gathered units and the activations (@sec-mechanics).",
        {"local_param_fraction": f["local_param_fraction"]},
    )  # fmt: skip


def gotcha1_dtensor(seed_code: dict) -> Judgement:
    t = seed_code["trainer_fsdp2_eval"]
    reproduced = t["outcome"] != "ok"
    done = (f"{t['steps']} steps, {t['evaluations']} evaluations, checkpoints saved after steps "
            f"{', '.join(map(str, t['checkpoints_saved_at'])) or 'none'}, {t['train_steps_after_first_eval']} "
            f"training steps after the first evaluation and {t['train_steps_after_first_save']} after the first "
            f"save, train loss {t['train_loss_first']:.3f} -> {t['train_loss_last']:.3f}, eval loss "
            f"{t['eval_loss_first']:.3f} -> {t['eval_loss_last']:.3f}" if not reproduced else t["error"])  # fmt: skip
    cycle = not reproduced and t["train_steps_after_first_eval"] > 0 and t["train_steps_after_first_save"] > 0
    return Judgement(
        "gotcha1_dtensor", SEED1, "§5.1 gotcha 1", "FSDP2 after the first evaluation",
        "On the Trainer's FSDP2 path a run dies right after its first evaluation/checkpoint cycle with \"mixed "
        "torch.Tensor and DTensor\" (tied embeddings left as plain tensors); pinning FSDP1 avoids it.",
        "holds" if reproduced else "wrong on this stack" if cycle else "open: the cycle did not run",
        [f"SFTTrainer with FSDP2 (effective: {t.get('strategy', 'failed')}) on 2 gloo ranks, the tiny SmolLM3 "
         f"(tied embeddings: {t.get('tied_embeddings')}), activation checkpointing "
         f"{'on' if t.get('activation_checkpointing') else 'off'}, evaluating after every step and saving a "
         f"checkpoint every second: {done}."],
        "On the pinned stack the Trainer's FSDP2 path trains on through evaluations and checkpoint saves; do not "
        "pin FSDP1 for this. Still untested here: bf16 compute on GPUs, the 3B model, and a run of the seed's "
        "length (about 100 steps before the first evaluation). The error still exists in another form: calling "
        "a submodule that FSDP2 did not shard on its own (@sec-gotchas, where FSDP1 fails too).",
        {"reproduced": reproduced, **t},
    )  # fmt: skip


def checkpoint_size(seed_code: dict) -> Judgement:
    f = seed_code["full_step"]
    with torch.device("meta"):
        from transformers import SmolLM3ForCausalLM  # deferred: heavy, only this claim builds a model

        big = SmolLM3ForCausalLM(resolve_model_config("smollm3-3b"))
    est = estimate_checkpoint_bytes(big)
    off = f["checkpoint_bytes_on_disk"] / f["checkpoint_bytes_estimate"] - 1
    return Judgement(
        "checkpoint_size", SEED1, GOTCHA2, "the size of an FSDP checkpoint",
        "A 3B FSDP checkpoint holds the weights and the full fp32 Adam state: more than about 30 GB.",
        "holds" if est > 30 * 10**9 and abs(off) < 0.1 else "partly" if est > 30 * 10**9 else "wrong",
        [f"`smolfsdp.checkpoint.disk.estimate_checkpoint_bytes` for SmolLM3-3B (fp32 weights, the tied embedding "
         f"written under both names, AdamW m and v, 5 % for DCP's metadata): {gb(est)} ({gib(est)}).",
         f"Measured on the tiny model, 2 ranks: a DCP checkpoint of the model and AdamW state after one step is "
         f"{f['checkpoint_bytes_on_disk']:,} bytes on disk; the same estimate says "
         f"{f['checkpoint_bytes_estimate']:,} ({off:+.1%})."],
        f"Right as a floor: plan for about {gb(est)} per checkpoint, and check the free disk before training "
        "(the package does: `check_disk_space`).",
        {"estimate_3b": est, "tiny_on_disk": f["checkpoint_bytes_on_disk"], "tiny_estimate": f["checkpoint_bytes_estimate"]},
    )  # fmt: skip


def wrap_class_trainer(seed_code: dict | None = None) -> Judgement:
    """Through the Trainer, accelerate resolves the class names; ``seed_code`` (``run_seed_code``'s result)
    adds what torch's own ``fully_shard`` loop does with the wrong class (seed 2's code)."""
    from accelerate.utils import FullyShardedDataParallelPlugin  # deferred: heavy, only this claim
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy  # deferred with it

    from smolfsdp.gotchas.builders import tiny_model  # deferred: builds a model (torch, transformers)

    model, tried = tiny_model()[0], {}
    for version in (1, 2):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                transformer_cls_names_to_wrap="LlamaDecoderLayer")  # fmt: skip
        try:
            plugin.set_auto_wrap_policy(model) if version == 1 else fsdp2_prepare_auto_wrap_policy(
                plugin, model
            )
            tried[f"FSDP{version}"] = "accepted"
        except ValueError as err:
            tried[f"FSDP{version}"] = f"ValueError: {err}"
    lines = [
        source_line("accelerate.utils.dataclasses", "Could not find the transformer layer class"),
        source_line("accelerate.utils.fsdp_utils", "Could not find the transformer layer class"),
    ]
    evidence = [
        f"accelerate's plugin, given `LlamaDecoderLayer` for the tiny SmolLM3: FSDP1 "
        f'"{tried["FSDP1"]}", FSDP2 "{tried["FSDP2"]}" ({lines[0]}, {lines[1]}); the Trainer calls it '
        f"when it prepares the model ({source_line('accelerate.accelerator', 'set_auto_wrap_policy(model)')})."
    ]
    refused = all(v.startswith("ValueError") for v in tried.values())
    silent_loop = None
    if seed_code is not None:
        row = seed_code["seed2"]["seed, LlamaDecoderLayer"]
        silent_loop = row["fsdp_units"] == 1
        evidence.append(
            f"A hand-written loop is silent: seed 2's `isinstance(module, LlamaDecoderLayer)` loop on "
            f"2 ranks left {row['fsdp_units']} FSDP unit (the root), which gathers "
            f"{row['root_group_share']:.0%} of the model at once; it trained without a word."
        )
    return Judgement(
        "wrap_class_trainer", SEED1, CONFIG, "a wrong wrap class",
        "A wrap class the model does not have silently loses most of FSDP's memory savings.",
        "holds" if not refused else "partly" if silent_loop is not False else "wrong",
        evidence,
        "Through the Trainer (this seed's path) the pinned accelerate refuses a class name the model does not "
        "have, before training, so it is not silent. It is silent where the wrapping is hand-written, with "
        "torch's `transformer_auto_wrap_policy` or a `fully_shard` loop (seed 2): then the whole model is one "
        "unit. `smolfsdp.gotchas.cases_distributed.check_wrapping` counts the units and refuses that.",
        {"accelerate": tried, "lines": lines},
    )  # fmt: skip


def state_dict_comm(seed_code: dict) -> Judgement:
    c = seed_code["state_dict_collectives"]
    n = {k: sum(v.values()) for k, v in c.items()}
    v2 = n["FSDP2 model.state_dict()"] + n["FSDP2 get_model_state_dict()"]
    v1 = n["FSDP1 SHARDED_STATE_DICT"]
    return Judgement(
        "state_dict_comm", SEED2, "FSDP1 vs FSDP2", "communication in a sharded state dict",
        "FSDP2's sharded state dict needs no communication; FSDP1's needs extra communication.",
        "holds" if v2 == 0 and v1 > 0 else "wrong",
        ["Collectives counted with torch.profiler on rank 0 of 2 while each call builds the tiny model's state "
         "dict: " + "; ".join(f"{k}: {sum(v.values())} ({', '.join(f'{m} {x}' for m, x in v.items()) or 'none'})"
                               for k, v in c.items()) + "."],
        "Right: FSDP2's state dict is its DTensor shards as they are. FSDP1 issues one all-gather per unit even "
        "for its sharded form, as many as for its full one.",
        {"counts": n},
    )  # fmt: skip


def seed2_adapters(seed_code: dict) -> Judgement:
    rows, ck = seed_code["seed2"], seed_code["seed2_checkpointing"]
    r = rows[OWN_CLASS]
    trains = {k: v["adapters_nonzero_grad"] == v["adapters"] for k, v in ck.items()}
    hooked = {k: v["input_grad_hooks"] for k, v in ck.items()}
    # the reason the book gave (non-reentrant checkpointing) is the reason only if reentrant fails with the hooks
    reason_is_hook = trains["use_reentrant=True"] and not trains["use_reentrant=True, hooks removed"]
    default = source_line("transformers.modeling_utils", '{"use_reentrant": False}')
    return Judgement(
        "seed2_adapters", SEED2, "setting up LoRA + FSDP2", "the seed's LoRA set-up trains the adapters",
        "Enable gradient checkpointing, add LoRA, cast everything to bf16, freeze every parameter and unfreeze "
        "the LoRA ones: then only the adapters train.",
        "holds" if r["adapters_nonzero_grad"] == r["adapters"] == r["adapters_trainable"] else "wrong",
        [f"Run as written on 2 gloo ranks (tiny SmolLM3, two steps): {r['adapters_trainable']} of {r['adapters']} "
         f"adapter tensors trainable, {r['adapters_with_grad']} with a gradient, {r['adapters_nonzero_grad']} "
         f"non-zero at the second step (at the first, every `lora_A` gradient is zero because `lora_B` starts at "
         f"zero); adapters and gradients in {', '.join(r['adapter_dtypes'])}; every parameter sharded "
         f"({r['plain_tensor_params']} plain tensors left).",
         "Why it trains, the same set-up with each checkpointing form (adapters with a non-zero gradient; "
         "input-gradient hooks on the embedding): "
         + "; ".join(f"{k}: {v['adapters_nonzero_grad']} of {v['adapters']} ({hooked[k]} hook"
                     f"{'s' * (hooked[k] != 1)}{', removed' if v['input_grad_hooks_left'] == 0 and hooked[k] else ''}"
                     f"{'; backward: ' + repr(v['error']) if v.get('error') else ''})"
                     for k, v in ck.items())
         + f". transformers' default form is set at {default}."],
        ("Right on this stack, and not because of `use_reentrant=False`: reentrant checkpointing trains the "
         "adapters too, because `gradient_checkpointing_enable` (transformers) and `get_peft_model` (peft) each "
         "hook the input embeddings to make their output require a gradient; only with those hooks removed does "
         "reentrant checkpointing cut the adapters off. " if reason_is_hook else
         "Right on this stack; the checkpointing forms above say which mechanism carries the gradient. ")
        + "The cast makes the adapters bf16, so each AdamW update is rounded to bf16; the package keeps them fp32 "
        "on the bf16 base, which FSDP2 allows (the dtype rule above).",
        {**{k: r[k] for k in ("adapters", "adapters_trainable", "adapters_nonzero_grad", "adapter_dtypes")},
         "checkpointing_trains": trains, "input_grad_hooks": hooked, "reason_is_hook": reason_is_hook},
    )  # fmt: skip


def seed2_wrap(seed_code: dict) -> Judgement:
    bad, good = seed_code["seed2"][SEED_FORM], seed_code["seed2"][OWN_CLASS]
    return Judgement(
        "seed2_wrap", SEED2, "setting up LoRA + FSDP2", "wrapping by LlamaDecoderLayer",
        "Shard each `LlamaDecoderLayer` with `fully_shard`, then the whole model.",
        "holds" if bad["fsdp_units"] == good["fsdp_units"] else "partly",
        [f"As written, on the tiny SmolLM3: {bad['fsdp_units']} FSDP unit, the root gathers "
         f"{bad['root_group_share']:.0%} of the parameters at once, and training runs without a warning (loss "
         f"{bad['loss']:.4f}). With SmolLM3's own class: {good['fsdp_units']} units, the root holds "
         f"{good['root_group_share']:.0%} (loss {good['loss']:.4f}, the same numbers)."],
        "Right for a Llama model; for any other model the loop matches nothing and the model becomes one unit, "
        "which gives up the per-layer memory saving without a word. Take the class from the model "
        "(`smolfsdp.models.modeling.resolve_wrap_class`) and check the unit count.",
        {"units_llama": bad["fsdp_units"], "units_smollm3": good["fsdp_units"], "root_share": bad["root_group_share"]},
    )  # fmt: skip


def bf16_reduce(seed_code: dict, reduce: dict | None = None) -> Judgement:
    """``reduce``: :func:`smolfsdp.probes.reduce_precision.reduce_cost`'s result (run here when None)."""
    from smolfsdp.probes.reduce_precision import reduce_cost  # deferred: gloo threads, one claim

    rows = seed_code["seed2"]
    reduce = reduce or reduce_cost()
    err = {k: rows[k]["grad_error_vs_fp32"]["relative_l2"] for k in (OWN_CLASS, FP32_REDUCE, PACKAGE)}
    storage = {k: rows[k]["adapter_dtypes"] for k in (OWN_CLASS, PACKAGE)}  # both gather and compute in bf16
    policy_stores = storage[PACKAGE] == ["bfloat16"]  # does param_dtype=bf16 make the sharded storage bf16?
    costs = {w: r["relative_l2"]["bf16 reduce"] / r["relative_l2"]["fp32 reduce, bf16 gradient"]
             for w, r in reduce.items() if not r["bf16_equals_fp32_bf16"]}  # fmt: skip
    scale = "; ".join(
        f"{w} ranks: bf16 {r['relative_l2']['bf16 reduce']:.2e}, fp32 then bf16 "
        f"{r['relative_l2']['fp32 reduce, bf16 gradient']:.2e}, fp32 kept {r['relative_l2']['fp32 reduce, fp32 gradient']:.1e}"
        f" ({'bit-equal' if r['bf16_equals_fp32_bf16'] else 'different'})"
        for w, r in reduce.items()
    )
    worse = [w for w, c in costs.items() if c > 1.2]
    verdict = ("holds" if policy_stores and not worse else
               "partly: bf16 stores only because the seed casts the model; the bf16 reduction costs accuracy "
               f"from {min(worse)} ranks" if worse else "partly: bf16 stores only because the seed casts the model")  # fmt: skip
    n = next(iter(reduce.values()))["numel"]
    return Judgement(
        "bf16_reduce", SEED2, "setting up LoRA + FSDP2", "mixed precision with a bf16 reduction",
        "`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)` makes bf16 the dtype of parameter storage "
        "and of the communication, for less memory and faster computation.",
        verdict,
        [f"What the policy stores: under the same `param_dtype=bf16` the seed's sharded adapters are "
         f"{', '.join(storage[OWN_CLASS])} and the package's {', '.join(storage[PACKAGE])} (2 gloo ranks): "
         "`param_dtype` is the dtype FSDP2 gathers and computes the unsharded parameters in; the shards keep "
         "the dtype the model had (bf16 in the seed because it casts the whole model first).",
         f"Its cost on 2 ranks, the adapters' gradients at the second step against an all-fp32 run (relative L2): "
         f"seed's policy {err[OWN_CLASS]:.2%}, the same with `reduce_dtype=fp32` {err[FP32_REDUCE]:.2%}, the "
         f"package's version {err[PACKAGE]:.2%}: {'identical' if err[OWN_CLASS] == err[FP32_REDUCE] else 'different'}"
         ", as they must be (a sum of two bf16 values is rounded once either way).",
         f"FSDP2's reduce-scatter of bf16 gradients ({n:,} values per rank) on gloo ranks "
         f"(`smolfsdp.probes.reduce_precision`), error of the mean against an fp64 sum: {scale}. Time is not measured: "
         "CPU gloo threads on a shared CPU time the scheduler, and say nothing about NCCL on GPUs."],
        "`param_dtype` sets the gathered compute copy, not the storage: cast the model (as the seed does) for bf16 "
        "shards, or keep fp32 shards as a master copy (the package). A bf16 reduction is free on 2 ranks and rounds "
        "at each step from 4 on"
        + (f" (about {max(costs.values()):.0f} times the error of an fp32 one at {max(costs, key=costs.get)} ranks "
           "here)" if costs else "") + ", which is why the package reduces in fp32; whether bf16 is faster on GPUs "
        "(half the bytes on the link) needs a GPU run.",
        {"relative_l2": err, "bf16_equals_fp32_reduce": err[OWN_CLASS] == err[FP32_REDUCE], "storage": storage,
         "policy_sets_storage": policy_stores, "reduce": reduce, "error_ratio": costs},
    )  # fmt: skip


# ---------------------------------------------------------------------------- the "as written" tables
def seed2_table(seed_code: dict) -> pd.DataFrame:
    """One column per form of seed 2's set-up (and the package's), one row per measured fact."""
    out = {}
    for label, r in seed_code["seed2"].items():
        e = r["grad_error_vs_fp32"]
        out[label] = {
            "FSDP units": f"{r['fsdp_units']}",
            "share of parameters in the root group": "-" if r["root_group_share"] is None else f"{r['root_group_share']:.0%}",
            "parameters left unsharded (plain tensors)": f"{r['plain_tensor_params']}",
            "adapter tensors trainable / with non-zero gradient": f"{r['adapters_trainable']} / {r['adapters_nonzero_grad']} of {r['adapters']}",
            "adapter dtype": ", ".join(r["adapter_dtypes"]),
            "loss at the second step": f"{r['loss']:.4f}",
            "adapters' gradient error vs all fp32 (relative L2)": "0 (the reference)" if e["relative_l2"] == 0 else f"{e['relative_l2']:.2%}",
        }  # fmt: skip
    return pd.DataFrame(out)


def state_dict_table(seed_code: dict) -> pd.DataFrame:
    c = seed_code["state_dict_collectives"]
    return pd.DataFrame(
        {"collectives (rank 0)": {k: sum(v.values()) for k, v in c.items()},
         "of which": {k: ", ".join(f"{m}: {x}" for m, x in v.items()) or "none" for k, v in c.items()}}
    )  # fmt: skip


def fsdp_config_table() -> pd.DataFrame:
    """Seed 1's ``fsdp_config`` keys as written, and what the installed TrainingArguments hands accelerate."""
    from smolfsdp.audit.seeds.installed_stack import trainer_fsdp_view  # deferred: imports transformers

    args, _ = trainer_fsdp_view(SEED_FSDP_CONFIG, SEED_FSDP_ARG)
    on, _ = trainer_fsdp_view({**SEED_FSDP_CONFIG, "fsdp_offload_params": True}, SEED_FSDP_ARG)
    plugin = {"version": "fsdp_version", "transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
              "backward_prefetch": "backward_prefetch", "state_dict_type": "state_dict_type",
              "offload_params": "cpu_offload"}  # fmt: skip
    rows = {}
    for key, value in SEED_FSDP_CONFIG.items():
        name = plugin[key.removeprefix("fsdp_")]
        got = (on if key == "fsdp_offload_params" else args).get(name, "(absent)")
        rows[key] = {"the seed writes": repr(value) if key != "fsdp_offload_params" else "False (True to offload)",
                     "read as": key.removeprefix("fsdp_"), "accelerate's plugin gets": f"{name} = {got}",
                     "effect": "ignored: no such key" if got == "(absent)" else "used"}  # fmt: skip
    return pd.DataFrame(rows).T


def _arg_text(value) -> str:
    """A plugin argument for a reader: a flag as its state (``on (True)``), anything else as written."""
    return f"{'on' if value else 'off'} ({value})" if isinstance(value, bool) else str(value)


def plugin_args_side_by_side(name: str = "smollm3_3b_medical") -> pd.DataFrame:
    """accelerate's FSDP plugin arguments as the installed TrainingArguments builds them from seed 1's
    ``fsdp_config`` (as written) and from the package's (``trainer_fsdp_config`` for the book's recipe)."""
    from smolfsdp.audit.seeds.installed_stack import trainer_fsdp_view  # deferred: imports transformers
    from smolfsdp.train.trl_engine import trainer_fsdp_config  # deferred: imports trl, the heaviest

    seed, seed_warn = trainer_fsdp_view(SEED_FSDP_CONFIG, SEED_FSDP_ARG)
    from smolfsdp.train.trl_engine import keep_fp32_buffers_and_reduce  # deferred with it

    cfg = load_config(recipe(name))
    ours, our_warn = trainer_fsdp_view(trainer_fsdp_config(cfg, "SmolLM3DecoderLayer", on_cpu=False))
    added = SimpleNamespace(fsdp_plugin_args=dict(ours))
    keep_fp32_buffers_and_reduce(added, cfg)  # what the package's engine adds to the plugin arguments
    ours = added.fsdp_plugin_args
    if "mixed_precision_policy" in ours:
        mp = ours["mixed_precision_policy"]
        ours["mixed_precision_policy"] = ", ".join(
            f"{f.split('_')[0]} {str(getattr(mp, f, None)).removeprefix('torch.')}"
            for f in ("param_dtype", "reduce_dtype", "buffer_dtype") if hasattr(mp, f)
        )  # fmt: skip
        seed["mixed_precision_policy"] = "(not set: accelerate fills bf16 for all from bf16=True)"
    keys = list(dict.fromkeys([*seed, *ours]))
    table = pd.DataFrame(
        {"seed 1 as written": [_arg_text(seed.get(k, "(not set)")) for k in keys],
         f"the package ({name})": [_arg_text(ours.get(k, "(not set)")) for k in keys]}, index=keys,
    )  # fmt: skip
    table.loc["warnings logged by TrainingArguments"] = [str(len(seed_warn)), str(len(our_warn))]
    return table


def seed2_reading(seed_code: dict) -> str:
    """The reading of :func:`seed2_table` as sentences built from the run (Markdown)."""
    rows = seed_code["seed2"]
    bad, own = rows[SEED_FORM], rows[OWN_CLASS]
    err = {k: r["grad_error_vs_fp32"]["relative_l2"] for k, r in rows.items()}
    all_train = all(r["adapters"] == r["adapters_nonzero_grad"] for r in rows.values())
    unsharded = sum(r["plain_tensor_params"] for r in rows.values())
    same_loss = bad["loss"] == own["loss"]
    return (
        f"Read the first column against the second. With the seed's class the model has {bad['fsdp_units']} FSDP "
        f"unit{'s' * (bad['fsdp_units'] != 1)}, whose root group holds {bad['root_group_share']:.0%} of the "
        f"parameters and is gathered whole; with SmolLM3's class, {own['fsdp_units']} units. "
        + ("The loss is the same in both, which is why nothing warns. " if same_loss else
           f"The losses differ ({bad['loss']:.4f} and {own['loss']:.4f}). ")
        + f"Adapters: {'in every form all of them' if all_train else 'not in every form do all of them'} receive a "
        f"non-zero gradient, and {unsharded} parameters are left as plain, unsharded tensors across the forms. "
        f"Gradient error against the all-fp32 run: {err[OWN_CLASS]:.2%} with the seed's bf16 reduction, "
        f"{err[FP32_REDUCE]:.2%} with an fp32 one, {err[PACKAGE]:.2%} for the package's version"
        + (": on two ranks the error comes from computing in bf16, not from reducing in it."
           if err[OWN_CLASS] == err[FP32_REDUCE] else ".")
    )  # fmt: skip
