"""The estimator held to the dry run: static terms exact, the peak within a stated tolerance.

``compare_with_estimate(report, cfg)`` puts ``smolfsdp.estimate.memory.estimate_memory`` (static components) and
``smolfsdp.estimate.moments.peak_moments`` (the peak as it happens) beside what the dry run traced for the same
setup. Used by ``smolfsdp dryrun``, ``scripts/dryrun_grid.py`` and the appendix "How the estimates are
checked".
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from smolfsdp.config import TrainConfig, load_config
from smolfsdp.estimate.adamw_step import engine_optimizer, traced_adamw
from smolfsdp.estimate.loss_path import engine_loss_path
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import LoraSpec, resolve_model_config

GIB = 2**30


def estimate_for(cfg: TrainConfig, world_size: int, loss_path: str | None = None, adamw: str | None = None):
    """``estimate_memory`` for the setup ``cfg`` runs (the recipe smolfsdp's engines use: fp32 parameters,
    gradients and AdamW state, bf16 compute under ``mixed_precision: bf16``; its LoRA adapters with their
    dropout and FSDP1 ``lora_layout``; its gradient accumulation; its engine's loss, ``loss_path`` when given:
    a dry run's ``setup["loss_path"]``, transformers' for rows traced before the dry run took TRL's; the AdamW
    step its engine builds on a GPU, ``adamw_step.engine_optimizer``, or ``adamw``: the one a dry run built)."""
    spec = (
        LoraSpec(cfg.lora_r, cfg.lora_alpha, tuple(cfg.lora_target_modules), cfg.lora_dropout)
        if cfg.lora
        else None
    )
    return estimate_memory(
        resolve_model_config(cfg.model, trust_remote_code=cfg.trust_remote_code),
        world_size=world_size,
        strategy=cfg.sharding_strategy,
        recipe="hf-fsdp-bf16" if cfg.mixed_precision == "bf16" else "fp32",
        seq_len=cfg.max_length,
        micro_batch=cfg.per_device_train_batch_size,
        lora=spec,
        offload=cfg.cpu_offload,
        activation_checkpointing=cfg.activation_checkpointing,
        ac_mode=cfg.ac_mode,
        ac_every=cfg.ac_every,
        fsdp_version=cfg.fsdp_version,
        lora_layout=cfg.lora_layout if cfg.lora and cfg.fsdp_version == 1 else "in-unit",
        gpus_per_node=world_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        loss_path=loss_path or engine_loss_path(cfg.engine),
        adamw=adamw or engine_optimizer(cfg.engine),
    )


def compare_with_estimate(report, cfg: TrainConfig) -> pd.DataFrame:
    """Rows ``parameters``, ``gradients``, ``optimizer state`` (storage bytes after the step) and ``peak``
    (tensors at the estimate's fullest moment, ``MemoryEstimate.moments``, against the traced peak; with CPU
    offload one host row and the device's peak): ``estimate_gib``, ``dry_run_gib``, ``error_pct`` (estimate vs
    dry run, signed)."""
    # the loss the dry run traced (committed rows from before TRL's fused head was traced: transformers') and
    # the AdamW step it built (the committed grids: foreach)
    setup = report.setup
    est = estimate_for(cfg, setup["world_size"], setup.get("loss_path", "transformers"), traced_adamw(setup))
    held, moment = report.held_bytes, est.peak_moment
    peak = est.moments[moment]
    offload = getattr(report, "offload", None)
    if offload:  # the static terms live on the host; the device peak leaves them out
        rows = [
            ("host: parameters, gradients, optimizer state", est.host_bytes, sum(held.values())),
            (f"peak, device ({moment} moment)", peak, offload["device_peak_bytes"]),
        ]
    else:
        rows = [
            ("parameters", est.params_bytes + est.master_bytes, held["param_bytes"]),
            ("gradients", est.grads_bytes, held["grad_bytes"]),
            ("optimizer state", est.optimizer_bytes, held["optimizer_bytes"]),
            (f"peak ({moment} moment)", peak, report.peak_bytes),
        ]
    return pd.DataFrame(
        [{"component": name, "estimate_gib": e / GIB, "dry_run_gib": d / GIB,
          "error_pct": 100 * (e - d) / d if d else (0.0 if e == 0 else float("inf"))} for name, e, d in rows]
    )  # fmt: skip


def compare_committed(row: dict, root) -> pd.DataFrame:
    """:func:`compare_with_estimate` for one committed row of ``data/results/dryrun/grid.json`` (its recipe
    under ``root``, its overrides, its traced bytes): the current estimator against what was traced then."""
    overrides = dict(row["overrides"])
    if str(overrides.get("model", "")).startswith("data/"):  # a config folder of the repository (data/models)
        overrides["model"] = str(Path(root) / overrides["model"])
    cfg = load_config(Path(root) / row["recipe"], **overrides)
    traced = SimpleNamespace(setup=row["setup"], held_bytes=row["held_bytes"], peak_bytes=row["peak_bytes"])
    return compare_with_estimate(traced, cfg)
