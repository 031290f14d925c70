"""The seeds' claims about FSDP2's rules: one dtype per group, DTensor parameters, LoRA adapters, state dicts, meta init.

Settled by the dtype-rule probe (``smolfsdp.probes.dtype_rule``), the seed-code run on 2 gloo ranks (``seed_code``:
the seed's LoRA + FSDP2 code as written, beside the package's) and the dry-run grid (FSDP1 vs FSDP2 peaks). Also the
tables of the chapter's section "The seeds' code as written". Used by ``smolfsdp.audit.seeds.claims``.

    python -c "from smolfsdp.audit.seeds.seed_code import run_seed_code as r; from smolfsdp.audit.seeds.fsdp2_claims \\
        import seed2_table as t; print(t(r('/tmp/seed-code')))"
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pandas as pd

from smolfsdp.audit.seeds.installed_stack import source_line
from smolfsdp.audit.seeds.judgement import DRYRUN_GRID, GIB, SEED1, SEED2, SETUP, VS, Judgement, gib


def offload_policy() -> Judgement:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy  # deferred: torch is heavy

    doc = inspect.getdoc(OffloadPolicy).split(".")[0].replace("\n", " ")
    where = source_line(
        "torch.distributed.fsdp._fully_shard._fsdp_param", "isinstance(offload_policy, CPUOffloadPolicy)"
    )
    return Judgement(
        "offload_policy", SEED2, SETUP, "`OffloadPolicy()`",
        "Passing `offload_policy=OffloadPolicy()` to `fully_shard` offloads to the CPU.",
        "holds" if isinstance(OffloadPolicy(), CPUOffloadPolicy) else "wrong",
        [f"torch's docstring: \"{doc}.\" FSDP2 offloads only when the policy is a `CPUOffloadPolicy` "
         f"({where}); `CPUOffloadPolicy` is a subclass: {issubclass(CPUOffloadPolicy, OffloadPolicy)}."],
        "`OffloadPolicy()` is the default and means no offload; write `CPUOffloadPolicy()` "
        "(with `pin_memory=False` on a CPU-only machine).",
        {"doc": doc, "line": where},
    )  # fmt: skip


def dtype_rule(results: list[dict]) -> Judgement:
    """``results``: :func:`smolfsdp.probes.dtype_rule.check_dtype_rule`'s list (a launched run)."""
    ok = {r["case"]: r for r in results if r.get("fsdp", "FSDP2") == "FSDP2"}
    where = source_line(
        "torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDP expects uniform original"
    )
    fmt = {True: "works", False: "refused"}
    mixed_ok = ok["frozen_bf16_beside_trainable_fp32"]["ok"] or ok["trainable_fp32_and_bf16_own_groups"]["ok"]
    verdict = ("wrong" if ok["trainable_fp32_and_bf16_same_group"]["ok"] else
               "partly: narrower than stated" if mixed_ok else "holds")  # fmt: skip
    return Judgement(
        "dtype_rule", SEED2, SETUP, "FSDP2 and parameter dtypes",
        "FSDP2 requires all parameters to have the same dtype.",
        verdict,
        ["One `fully_shard` group, one forward and backward on a gloo process: frozen bf16 weights beside "
         f"trainable fp32 ones {fmt[ok['frozen_bf16_beside_trainable_fp32']['ok']]}; trainable fp32 and bf16 "
         f"in one group {fmt[ok['trainable_fp32_and_bf16_same_group']['ok']]} "
         f"(\"{ok['trainable_fp32_and_bf16_same_group']['error']}\", {where}); the same two dtypes in groups "
         f"of their own {fmt[ok['trainable_fp32_and_bf16_own_groups']['ok']]}."],
        "The rule is narrower: the trainable parameters of one `fully_shard` group must share one dtype. "
        "Frozen weights (a LoRA base) may keep another, and each group may have its own.",
        {k: v["ok"] for k, v in ok.items()},
    )  # fmt: skip


def flat_parameter(results: list[dict]) -> Judgement:
    """FSDP1's FlatParameter and per-parameter freezing/casting, from the same dtype-rule run."""
    ok = {(r["fsdp"], r["case"]): r for r in results}
    case = "frozen_bf16_beside_trainable_fp32"
    return Judgement(
        "flat_parameter", SEED2, VS, "FSDP1's FlatParameter",
        "FSDP1 flattens a whole unit into one `FlatParameter`, which gets in the way of treating parameters "
        "one by one (freezing some, casting some).",
        "holds" if not ok[("FSDP1", case)]["ok"] and ok[("FSDP2", case)]["ok"] else "partly",
        [f"The dtype-rule run: one unit holding a frozen bf16 weight beside trainable fp32 ones is "
         f"{'accepted' if ok[('FSDP1', case)]['ok'] else 'refused'} by FSDP1 "
         f"(\"{ok[('FSDP1', case)]['error']}\") and {'accepted' if ok[('FSDP2', case)]['ok'] else 'refused'} by "
         "FSDP2. Freezing part of a unit works in FSDP1 only with `use_orig_params=True` (@sec-fsdp1-vs-fsdp2)."],
        "Right. A LoRA base in bf16 with fp32 adapters needs FSDP2, or FSDP1 with the adapters in the base dtype.",
        {"fsdp1_ok": ok[("FSDP1", case)]["ok"], "fsdp2_ok": ok[("FSDP2", case)]["ok"]},
    )  # fmt: skip


def _record_stream_calls(folder) -> int:
    return sum(f.read_text().count("record_stream(") for f in folder.glob("*.py"))


def fsdp_version_pairs(grid_path: str | Path = DRYRUN_GRID) -> list[dict]:
    """Peaks (bytes) of the grid's FSDP1 and FSDP2 rows at equal shapes (LoRA, activation checkpointing,
    ``max_length``, ranks), one dict per shape; ``[]`` when the grid is absent."""
    path = Path(grid_path)
    if not path.is_file():
        return []
    by = {}
    for run in json.loads(path.read_text())["runs"]:
        o = run["overrides"]
        if o.get("gradient_accumulation_steps", 1) != 1:
            continue
        shape = (bool(o["lora"]), bool(o["activation_checkpointing"]), o["max_length"], o["nproc"])
        by.setdefault(shape, {})[o["fsdp_version"]] = run["peak_bytes"]
    return [{"lora": k[0], "ac": k[1], "seq": k[2], "ranks": k[3], "fsdp1": v[1], "fsdp2": v[2]}
            for k, v in sorted(by.items()) if 1 in v and 2 in v]  # fmt: skip


def deterministic_memory(grid_path: str | Path = DRYRUN_GRID) -> Judgement:
    import torch.distributed.fsdp as fsdp  # deferred: torch is heavy

    root = Path(fsdp.__file__).parent
    v1, v2 = _record_stream_calls(root), _record_stream_calls(root / "_fully_shard")
    pairs = fsdp_version_pairs(grid_path)
    tol = GIB // 10  # the dry run's own jitter between versions (a few MiB of flat-parameter padding)
    lower = [p for p in pairs if p["fsdp2"] < p["fsdp1"] - tol]
    higher = [p for p in pairs if p["fsdp2"] > p["fsdp1"] + tol]

    def kinds(ps):
        return sorted({f"{'LoRA' if p['lora'] else 'full'} AC {'on' if p['ac'] else 'off'}" for p in ps})

    gap = max((p["fsdp1"] - p["fsdp2"] for p in lower), default=0)
    grid = (
        f"The committed dry-run grid ({len(pairs)} shapes run with both versions, fake tensors, no GPU): FSDP2's "
        f"peak is lower in {len(lower)} ({', '.join(kinds(lower)) or 'none'}; by up to {gib(gap)}), higher in "
        f"{len(higher)}, and within {gib(tol)} in the other {len(pairs) - len(lower) - len(higher)} "
        f"({', '.join(kinds([p for p in pairs if p not in lower and p not in higher])) or 'none'})."
        if pairs
        else f"No dry-run grid is present ({DRYRUN_GRID.name} is absent)."
    )
    verdict = ("open: needs GPU memory traces of both versions" if not pairs else
               "wrong: FSDP2's peak is higher in the dry run" if higher else
               "partly: lower only for LoRA without checkpointing; predictability open" if lower
               and kinds(lower) == ["LoRA AC off"] else
               "partly: lower in some shapes; predictability open" if lower else
               "partly: equal peaks in the dry run; predictability open")  # fmt: skip
    return Judgement(
        "deterministic_memory", SEED2, VS, "FSDP2's memory management",
        "FSDP2 holds less and more predictable GPU memory than FSDP1 because it does not use `recordStream`, "
        "and it needs no CPU synchronisation for that.",
        verdict,
        [grid, f"The mechanism is in the installed source: `record_stream(` appears {v1} times in FSDP1's files "
         f"(torch/distributed/fsdp/*.py) and {v2} times in FSDP2's (torch/distributed/fsdp/_fully_shard/). "
         "The dry run allocates in program order, with no CUDA streams and no caching allocator, so what "
         "`recordStream` does to memory (blocks held until another stream is done) is not in it."],
        "Lower: only where FSDP1 keeps more (a LoRA model without activation checkpointing: FSDP1's flat "
        "gradients cover the frozen base too); for full fine-tunes the peaks are equal. More predictable: still "
        "open; it needs the allocator's reserved memory and its spread over steps for both versions on 2+ GPUs.",
        {"fsdp1_record_stream": v1, "fsdp2_record_stream": v2, "pairs": pairs, "lower": len(lower),
         "higher": len(higher), "max_gap_bytes": gap},
    )  # fmt: skip


SEED_FORM, OWN_CLASS, FP32_REDUCE, REFERENCE, PACKAGE = (
    "seed, LlamaDecoderLayer", "seed, SmolLM3DecoderLayer", "seed, SmolLM3DecoderLayer, fp32 reduce",
    "all fp32 (reference)", "package: apply_lora + apply_fsdp2",
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


def meta_init(seed_code: dict) -> Judgement:
    m = seed_code["meta_init"]
    v2, v1 = m["fsdp2"], m["fsdp1"]
    init_fn = source_line(
        "torch.distributed.fsdp.fully_sharded_data_parallel", "param_init_fn (Optional[Callable"
    )
    works = v2["finite"] and v2["dtensor_params"] == v2["params"]
    return Judgement(
        "meta_init", SEED2, VS, "meta-device initialisation",
        "FSDP2 has a simpler meta-device initialisation flow than FSDP1.",
        ("holds" if works and v1.get("outcome") != "wrapped" else "partly: both work here") if works else "wrong",
        [f"On 2 gloo ranks, the tiny SmolLM3 built on the meta device and sharded with `fully_shard` as it is "
         f"({v2['params_on_meta_after_shard']} of {v2['params']} parameters still on meta, all DTensors): "
         f"then {' and '.join(f'`{c}`' for c in v2['calls_after_shard'])}, and one step gives a finite loss "
         f"{v2['loss']:.3f}. FSDP1 on the same meta model with no `param_init_fn` ({init_fn}): {v1['outcome']}"
         + (f", {v1['params_on_meta']} parameters left on meta" if "params_on_meta" in v1 else "") + "."],
        "Right: FSDP2 shards the meta model first and allocates only each rank's shards (`to_empty`), then the "
        "model's own initialisation runs on them. FSDP1 materialises inside its constructor, through a "
        "`param_init_fn` per module or `sync_module_states` from rank 0's real weights.",
        {"fsdp2": v2, "fsdp1": v1, "init_fn_line": init_fn},
    )  # fmt: skip
