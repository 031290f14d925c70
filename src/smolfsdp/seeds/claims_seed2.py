"""Seed 2's claims that the estimator and the installed libraries settle, and the dtype rule (a 1-process run).

Seed 2 is a blog post on FSDP, FSDP1 vs FSDP2, and LoRA with FSDP2's ``fully_shard`` in a plain PyTorch loop.
Used by ``smolfsdp.seeds.claims`` (chapter "What the seeds say, and what we measured"); its claims that
need 2 ranks are in ``claims_runs``. Every claim is in the book's words.

    python -c "from smolfsdp.seeds.claims_seed2 import eight_b_full as f; print(f().evidence_text)"
"""

from __future__ import annotations

import inspect
from pathlib import Path

from smolfsdp.measure.hardware import GPUS, fits
from smolfsdp.measure.memory import estimate_memory
from smolfsdp.measure.params import LoraSpec, count_parameters, llama3_8b_config, resolve_model_config
from smolfsdp.seeds.claims_core import GB, SEED2, Judgement, gb, gib
from smolfsdp.seeds.installed_stack import source_line

VS, SETUP, SUMMARY = "FSDP1 vs FSDP2", "setting up LoRA + FSDP2", "summary"


def offload_policy() -> Judgement:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy  # deferred: torch is heavy

    doc = inspect.getdoc(OffloadPolicy).split(".")[0].replace("\n", " ")
    where = source_line(
        "torch.distributed.fsdp._fully_shard._fsdp_param", "isinstance(offload_policy, CPUOffloadPolicy)"
    )
    return Judgement(
        "offload_policy", SEED2, SETUP, "`OffloadPolicy()`",
        "Passing `offload_policy=OffloadPolicy()` to `fully_shard` offloads to the CPU.",
        "wrong",
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
    return Judgement(
        "dtype_rule", SEED2, SETUP, "FSDP2 and parameter dtypes",
        "FSDP2 requires all parameters to have the same dtype.",
        "partly: narrower than stated",
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


def deterministic_memory() -> Judgement:
    import torch.distributed.fsdp as fsdp  # deferred: torch is heavy

    root = Path(fsdp.__file__).parent
    v1, v2 = _record_stream_calls(root), _record_stream_calls(root / "_fully_shard")
    return Judgement(
        "deterministic_memory", SEED2, VS, "FSDP2's memory management",
        "FSDP2 holds less and more predictable GPU memory than FSDP1 because it does not use `recordStream`, "
        "and it needs no CPU synchronisation for that.",
        "open: needs GPU memory traces of both versions",
        [f"The mechanism is in the installed source: `record_stream(` appears {v1} times in FSDP1's files "
         f"(torch/distributed/fsdp/*.py) and {v2} times in FSDP2's (torch/distributed/fsdp/_fully_shard/). "
         "What it does to memory needs CUDA streams: a CPU run has none."],
        "Plausible from the source, not measured here: the book's GPU check runs FSDP2 alone on one GPU. "
        "Judging it needs the peak and its spread over steps for FSDP1 and FSDP2 on 2+ GPUs.",
        {"fsdp1_record_stream": v1, "fsdp2_record_stream": v2},
    )  # fmt: skip


def lora_size() -> Judgement:
    spec = LoraSpec()
    n = count_parameters(resolve_model_config("smollm3-3b"), spec).trainable
    sizes = {
        "the adapter in bf16 (2 B/param)": 2 * n,
        "the adapter in fp32 (4 B/param)": 4 * n,
        "Adam m + v (8 B/param)": 8 * n,
        "fp32 adapter + Adam m + v (12 B/param)": 12 * n,
    }
    near = min(sizes, key=lambda k: abs(sizes[k] - 50 * 10**6))
    return Judgement(
        "lora_size", SEED2, SUMMARY, "size of the LoRA update",
        "The LoRA update is small: about 50 MB.",
        "partly: right in size, wrong in what it names",
        [f"SmolLM3-3B with r={spec.r}, alpha={spec.alpha} on {'/'.join(t.split('_')[0] for t in spec.targets)} "
         f"has {n:,} trainable parameters: " + "; ".join(f"{k}: {v / 1e6:,.1f} MB" for k, v in sizes.items())
         + f". Closest to 50 MB: {near}."],
        "About 50 MB is what training the adapters keeps (their fp32 weights with Adam's m and v); the update "
        f"itself, the adapter file a run saves, is {sizes['the adapter in fp32 (4 B/param)'] / 1e6:,.1f} MB with "
        f"the fp32 adapters the book's LoRA runs keep, {sizes['the adapter in bf16 (2 B/param)'] / 1e6:,.1f} MB "
        "if saved in bf16. The frozen base is still the bulk of memory.",
        {"trainable": n, "nearest": near, **sizes},
    )  # fmt: skip


def sixteen_gb_on_four() -> Judgement:
    config = llama3_8b_config()
    n = count_parameters(config).total
    base = dict(
        world_size=4, strategy="FULL_SHARD", lora=True, recipe="pure-bf16", seq_len=2048, fsdp_version=2
    )
    rows = {"no activation checkpointing": estimate_memory(config, **base),
            "activation checkpointing": estimate_memory(config, **base, activation_checkpointing=True)}  # fmt: skip
    text = "; ".join(f"{k}: static {gib(e.static_bytes)}, peak {gib(e.peak_bytes)}" for k, e in rows.items())
    best = min(e.peak_bytes for e in rows.values())
    return Judgement(
        "sixteen_gb_on_four", SEED2, SUMMARY, "a 16 GB model on 4 GPUs",
        "A 16 GB model sharded over 4 GPUs keeps 4 GB of it per GPU and takes 6-8 GB per GPU in all.",
        "holds" if best <= 8 * GB else "wrong: optimistic",
        [f"A Llama-3-8B-shaped model ({n:,} parameters, {gb(2 * n)} in bf16), loaded in bf16, LoRA r=8, FSDP2 "
         f"FULL_SHARD over 4 GPUs, one sequence of 2,048 tokens: {text}."],
        f"The 4 GB shard is right (the sharded state is {gib(rows['activation checkpointing'].static_bytes)}). "
        "The gathered units, activations, logits over a 128k vocabulary, CUDA context and NCCL buffers come on "
        f"top: plan for {gib(best)} with activation checkpointing at 2,048 tokens.",
        {"params": n, **{k: {"static_bytes": e.static_bytes, "peak_bytes": e.peak_bytes} for k, e in rows.items()}},
        memory=True,
    )  # fmt: skip


def eight_b_full() -> Judgement:
    config = llama3_8b_config()
    n = count_parameters(config).total
    one = estimate_memory(
        config, world_size=1, strategy="NO_SHARD", seq_len=2048, activation_checkpointing=True
    )
    over = [g for g, gpu in GPUS.items() if not fits(one, gpu)]
    return Judgement(
        "eight_b_full", SEED2, SUMMARY, "an 8B full fine-tune without FSDP",
        "Fully fine-tuning the 8B model without FSDP could need more than 90 GB per GPU.",
        "holds" if one.static_bytes > 90 * GB else "wrong",
        [f"The estimator, a Llama-3-8B-shaped model ({n:,} parameters), one GPU, AdamW with an fp32 master copy "
         f"(16 B/param), one sequence of 2,048 tokens, activation checkpointing: static {gib(one.static_bytes)} "
         f"({gb(one.static_bytes)}), peak {gib(one.peak_bytes)}."],
        f"Understated rather than wrong: \"more than 90 GB\" is in fact about {gb(one.peak_bytes)} at the peak, "
        f"more than {len(over)} of the {len(GPUS)} GPUs in the book's table hold"
        + (f" (only {', '.join(g for g in GPUS if g not in over)} would fit it)." if len(over) < len(GPUS) else "."),
        {"params": n, "static_bytes": one.static_bytes, "peak_bytes": one.peak_bytes},
        memory=True,
    )  # fmt: skip


def checkpointing_saves() -> Judgement:
    config = llama3_8b_config()
    base = dict(
        world_size=4, strategy="FULL_SHARD", lora=True, recipe="pure-bf16", seq_len=2048, fsdp_version=2
    )
    off, on = (estimate_memory(config, **base, activation_checkpointing=ac) for ac in (False, True))
    return Judgement(
        "checkpointing_saves", SEED2, SETUP, "gradient checkpointing",
        "Gradient checkpointing lowers memory by keeping only some activations and recomputing the rest in backward.",
        "holds" if on.activations_bytes < off.activations_bytes else "wrong",
        [f"The estimator, seed 2's set-up (8B, LoRA, FSDP2 over 4, 2,048 tokens): activations "
         f"{gib(off.activations_bytes)} without, {gib(on.activations_bytes)} with checkpointing; peak "
         f"{gib(off.peak_bytes)} -> {gib(on.peak_bytes)}."],
        "Right; it costs about one more forward per step. Under FSDP prefer FSDP's own activation checkpointing "
        "(@sec-gotchas counts the all-gathers of both forms).",
        {"activations_off": off.activations_bytes, "activations_on": on.activations_bytes},
    )  # fmt: skip


def comm_volume() -> Judgement:
    from smolfsdp.measure.comm import estimate_collectives, step_bytes  # deferred: pandas tables, one claim

    sent = {s: step_bytes(estimate_collectives("smollm3-3b", strategy=s, n_gpus=2))["sent_bytes"]
            for s in ("FULL_SHARD", "NO_SHARD")}  # fmt: skip
    fsdp, ddp = float(sent["FULL_SHARD"].sum()), float(sent["NO_SHARD"].sum())
    same = {s: step_bytes(estimate_collectives("smollm3-3b", strategy=s, n_gpus=2, mixed_precision="no"))
            ["sent_bytes"].sum() for s in ("FULL_SHARD", "NO_SHARD")}  # fmt: skip
    parts = ", ".join(f"{k} {gb(v)}" for k, v in sent["FULL_SHARD"].items())
    return Judgement(
        "comm_volume", SEED2, "how FSDP works", "what FSDP costs in communication",
        "FSDP needs less GPU memory than DDP at the price of more communication.",
        "partly" if fsdp <= 1.1 * ddp else "holds",
        [f"`smolfsdp.measure.comm.estimate_collectives`, SmolLM3-3B on 2 GPUs, bytes each rank sends per step: "
         f"FULL_SHARD {gb(fsdp)} ({parts}; bf16 gathers, fp32 reduction, the book's recipe), DDP {gb(ddp)} "
         f"(fp32 all-reduce of the gradients); with every collective in fp32 the ratio is "
         f"{same['FULL_SHARD'] / same['NO_SHARD']:.2f}."],
        f"With the same dtypes FSDP sends {same['FULL_SHARD'] / same['NO_SHARD']:.1f} times what DDP does (the "
        "extra all-gather in backward); gathering in bf16 while reducing in fp32, as the book's recipe does, "
        f"brings it to {fsdp / ddp:.2f} times DDP's volume. What remains is where the bytes move: FSDP's "
        "all-gathers sit in forward and backward, where compute waits for them unless prefetching hides them.",
        {"fsdp_sent": fsdp, "ddp_sent": ddp, "fp32_ratio": float(same["FULL_SHARD"] / same["NO_SHARD"])},
    )  # fmt: skip
