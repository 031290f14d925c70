"""The full profile's time budget: what the full branches of the training chapters run, and how long
that takes on a 2-GPU box, estimated from FLOPs (never measured: no GPU has rendered the book yet).

The chapters read their full-branch sizes from here (``CH04_FULL_MAX_STEPS``, ``CH05_FULL``), so the
budget and the chapters cannot drift apart; the README's "Full profile: time budget" states
:func:`full_profile_budget`'s total (tests/test_gpu_ready.py checks that it does).

    python -c "from smolfsdp.book.full_budget import full_profile_budget as f; print(f())"

Per run: optimizer steps x the step time of ``smolfsdp.estimate.time_model.plan_time``, the one time model
``smolfsdp memory --config`` prints and chapters 01 and 07 show (``scaling.estimate_step``: the recipes' rows as
``time_model.data_tokens`` batches them, packed into ``max_length`` slots, ``6N + 12·L·H·Q·T`` model FLOPs per token, LoRA ``4N + 2N_train``, at the GPU's calibrated MFU less
what the run's activation checkpointing recomputes, collectives overlapped); evaluation at a third of the FLOPs per
token (forward only) at the same MFU; checkpoint writes at :data:`DISK_BYTES_PER_S`; and :data:`RUN_OVERHEAD_S`
per run for start-up, loading the 3B weights, sharding and the final export.
"""

from __future__ import annotations

import pandas as pd

from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.estimate.flops import flops_per_token, training_time_s
from smolfsdp.estimate.hardware import get_gpu
from smolfsdp.estimate.params import LoraSpec, count_parameters, resolve_model_config
from smolfsdp.estimate.time_model import plan_time
from smolfsdp.paths import recipe

#: Chapter "LoRA with FSDP2", full profile: the LoRA run and its full fine-tune twin stop here (about
#: 60 % of the packed epoch): the chapter compares their memory and loss over the same steps, not epochs.
CH04_FULL_MAX_STEPS = 200
#: Chapter "Reading the profiler", full profile: benchmark steps, and a profiled window of one step
#: without input shapes, so a 3B trace stays near a million events (read by the streaming loader).
CH05_FULL = {"benchmark_steps": 12, "profile_active": 1, "record_shapes": False}
#: Assumptions of the budget, stated with it.
DISK_BYTES_PER_S = 1e9
RUN_OVERHEAD_S = 180.0
BUDGET_GPUS = ("H100 SXM", "A100 80GB")


def full_profile_runs() -> list[dict]:
    """The full branches' runs: chapter, label, the loaded ``TrainConfig`` (with the chapter's overrides)."""
    main, lora = recipe("smollm3_3b_medical"), recipe("lora_smollm3_3b")
    cap = {"max_steps": CH04_FULL_MAX_STEPS, "save_steps": 0}
    runs = [
        ("01_finetune", "the real run: 1 epoch (TRL, FSDP1)", load_config(main)),
        ("04_lora_fsdp2", "LoRA (FSDP2)", load_config(lora, **cap)),
        ("04_lora_fsdp2", "full fine-tune twin (FSDP2)", load_config(lora, lora=False, **cap)),
    ]
    for version in (1, 2):
        cfg = load_config(
            main, engine="native", fsdp_version=version, profile=True, save_steps=0, **CH05_FULL
        )
        runs.append(("05_profiling", f"benchmark FSDP{version} (profiled)", cfg))
    bench = {k: v for k, v in CH05_FULL.items() if k == "benchmark_steps"}
    runs.append(("05_profiling", "benchmark TRL", load_config(main, engine="trl", save_steps=0, **bench)))
    return [{"chapter": c, "run": label, "cfg": cfg} for c, label, cfg in runs]


def optimizer_steps(cfg) -> int:
    """Optimizer steps of a run (benchmark steps, ``max_steps``, or its epochs of the training rows: ``plan_time``'s
    epoch, packed rows where the run packs). ConfigError when the rows are unknown (a hub data set without
    ``max_rows``)."""
    plan = plan_time(cfg)
    if plan.run_steps is None:
        raise ConfigError(f"{cfg.name}: optimizer steps unknown ({plan.rows_source}).")
    return plan.run_steps


def run_budget(cfg, gpu: str, n_gpus: int) -> dict:
    """One run's tokens, FLOPs and estimated seconds (see the module docstring for each term)."""
    config = resolve_model_config("smollm3-3b")  # the shipped config.json of the recipes' model
    lora = LoraSpec(cfg.lora_r, cfg.lora_alpha, tuple(cfg.lora_target_modules)) if cfg.lora else None
    counts = count_parameters(config, lora)
    q = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    geometry = (config.num_hidden_layers, config.num_attention_heads, int(q), cfg.max_length)
    fpt = flops_per_token(counts.total, *geometry, trainable_params=counts.trainable)
    steps = optimizer_steps(cfg)
    tokens = (
        steps * cfg.nproc * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * cfg.max_length
    )
    evals = 0 if cfg.benchmark_steps else (steps // cfg.eval_steps if cfg.eval_steps else 0) + 1
    eval_tokens = evals * cfg.eval_size * cfg.max_length
    saves = steps // cfg.save_steps if cfg.save_steps else 0
    # one checkpoint: fp32 weights (a tied embedding twice, as DCP writes it) and AdamW's two moments,
    # + 5 % (smolfsdp.checkpoint.disk.estimate_checkpoint_bytes)
    tied = counts.embedding if config.tie_word_embeddings else 0
    ckpt_bytes = int((4 * (counts.total + tied) + 8 * counts.trainable) * 1.05)
    peak = get_gpu(gpu).bf16_dense_tflops
    plan = plan_time(cfg, gpu, n_gpus)  # the one time model: step time at the calibrated MFU
    compute = steps * plan.step_s
    evaluate = training_time_s(eval_tokens, fpt / 3, peak, n_gpus, plan.mfu) if eval_tokens else 0.0
    write = saves * ckpt_bytes / DISK_BYTES_PER_S
    return {
        "optimizer steps": steps, "step s": plan.step_s, "MFU": plan.mfu, "tokens (upper bound)": tokens,
        "model FLOPs per token": fpt,
        "train s": compute, "eval s": evaluate, "checkpoints": saves, "checkpoint bytes": ckpt_bytes,
        "checkpoint write s": write, "overhead s": RUN_OVERHEAD_S,
        "total s": compute + evaluate + write + RUN_OVERHEAD_S,
    }  # fmt: skip


def full_profile_budget(gpu: str = "H100 SXM", n_gpus: int = 2) -> pd.DataFrame:
    """One row per full-branch run with its estimated seconds on ``n_gpus`` x ``gpu`` (``plan_time``'s step time).

    ``df["total s"].sum()`` is the full profile's training time; the chapters' other cells (estimates,
    figures, CPU probes) take minutes beside it.
    """
    rows = [
        {"chapter": r["chapter"], "run": r["run"], **run_budget(r["cfg"], gpu, n_gpus)}
        for r in full_profile_runs()
    ]
    return pd.DataFrame(rows)


def budget_hours(gpu: str = "H100 SXM", n_gpus: int = 2) -> float:
    """The full profile's estimated training time in hours, one decimal (the README states it)."""
    return round(float(full_profile_budget(gpu, n_gpus)["total s"].sum()) / 3600, 1)
