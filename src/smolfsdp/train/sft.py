"""The fine-tune: SmolLM3 on medical Q&A, with the TRL engine or the native engine.

``run(cfg)`` is what chapters and tests call: it checks the configuration before anything starts
(:func:`preflight`), launches ``cfg.nproc`` processes with torchrun, and returns the run's summary.
``train(cfg)`` is what each launched process runs.

Engines:

* ``trl``: TRL ``SFTTrainer`` with the seed run's FSDP settings passed as ``fsdp_config``
  (FSDP1 by default, full shard, auto-wrap at ``SmolLM3DecoderLayer``, ``BACKWARD_PRE``,
  ``SHARDED_STATE_DICT``, offload switch): ``smolfsdp.train.trl_engine``. On CPU,
  ``smolfsdp.train.accelerate_cpu_fsdp`` lifts accelerate's accelerator-only gate so the Trainer shards too.
* ``native``: ``smolfsdp.train.native``, a plain PyTorch loop that shards with FSDP1 or FSDP2 everywhere.

    smolfsdp train                                        # CPU smoke run, 2 processes, native FSDP1
    smolfsdp train --config configs/runs/smoke_trl.yaml   # the TRL path, FSDP1 on 2 CPU processes
    smolfsdp train --config configs/runs/smollm3_3b_medical.yaml   # the real run, 2 GPUs
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from smolfsdp import quiet
from smolfsdp.config import TrainConfig
from smolfsdp.data.prepare import prepare_data, too_long_hint
from smolfsdp.launch.checks import check_model_fits_data, check_output_dir, check_tied_head
from smolfsdp.measure.results import RunWriter, git_sha, hardware, load_run, versions
from smolfsdp.models.modeling import build_meta_model, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding.distributed import (
    check_offload_support,
    init_distributed,
    setup_logging,
    teardown,
)

log = logging.getLogger(__name__)


def preflight(cfg: TrainConfig) -> dict[str, Any]:
    """Every check that can fail before processes start: output folder (writable, run not already
    going), tokenizer and chat template, data file, column mapping, rows left after filtering, model
    preset, ``max_length`` within the model's positions, tied head vs checkpoint, wrap class.

    Raises ConfigError with the problem and the fix. Returns what it found (for logs).
    """
    from smolfsdp.config import ConfigError
    from smolfsdp.measure.results import check_run_dir

    quiet.install()  # apply_lora below builds a PeftModel in this process (transformers FutureWarning)
    check_output_dir(cfg)  # a folder, writable, and this run not already going (its lock)
    try:
        check_run_dir(cfg.run_dir, resume=bool(cfg.resume_from), overwrite=cfg.overwrite)
    except FileExistsError as err:
        raise ConfigError(str(err)) from err
    check_offload_support(cfg.fsdp_version, cfg.cpu_offload)  # FSDP1 offload on a CPU-only machine
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
    data = prepare_data(cfg, tokenizer)
    per_step = cfg.nproc * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    if len(data.train) < per_step:
        raise ConfigError(
            f"{len(data.train)} training rows cannot fill one optimizer step of {cfg.nproc} processes x "
            f"{cfg.per_device_train_batch_size} rows x {cfg.gradient_accumulation_steps} accumulation steps = "
            f"{per_step} rows. Add rows, or lower per_device_train_batch_size, nproc or eval_size."
            + too_long_hint(data.counts, cfg)
        )
    meta = build_meta_model(cfg.model, tokenizer, cfg.trust_remote_code)
    check_model_fits_data(cfg, meta)  # max_length within the model's positions
    check_tied_head(cfg.model, meta)  # config.json's tie_word_embeddings agrees with the checkpoint
    wrap_cls = resolve_wrap_class(meta, cfg.wrap_class)
    if cfg.lora:
        from smolfsdp.sharding.lora import apply_lora

        meta = apply_lora(meta, cfg)  # target modules exist, dtypes per FSDP group agree
    resume_path = None
    if cfg.resume_from:
        from smolfsdp.checkpoint.dcp import (
            check_engine,
            check_matches_model,
            check_resume_settings,
            resolve_resume,
        )

        resume_path = resolve_resume(cfg.resume_from, cfg.run_dir, hashes=True)  # every byte, before launch
        check_engine(resume_path, cfg.engine)
        check_matches_model(resume_path, meta, cfg.model)
        check_resume_settings(resume_path, cfg)
    needed = bytes_to_write(cfg, meta, resume_path)
    if needed:
        from smolfsdp.checkpoint.dcp import check_disk_space

        check_disk_space(cfg.output_dir, needed)
    return {"data": data.stats(), "wrap_class": wrap_cls.__name__}


def bytes_to_write(cfg: TrainConfig, meta_model, resume_path=None) -> int:
    """Disk bytes a run adds at its peak: the checkpoints it will hold at once beyond those already there,
    and the final model (or adapter). Estimated on the meta-device model.

    ``save_total_limit + 1`` checkpoints at most are on disk at once (the new one is complete before the
    oldest goes). A run resumed from ``resume_path`` (``step-N``) writes only the saves after step N, and
    its run folder's complete checkpoints already take their space (keep-last-K removes them as new ones
    complete): it adds ``min(kept + new, K + 1) - kept`` checkpoints.
    """
    from smolfsdp.checkpoint.dcp import checkpoint_dir, complete_checkpoints, estimate_checkpoint_bytes

    n_ckpt = 0
    if cfg.save_steps > 0:
        start = int(resume_path.name.split("-")[-1]) if resume_path is not None else 0
        kept = len(complete_checkpoints(checkpoint_dir(cfg.run_dir))) if resume_path is not None else 0
        total = cfg.max_steps if cfg.max_steps > 0 else None
        new = cfg.save_total_limit + 1 if total is None else total // cfg.save_steps - start // cfg.save_steps
        n_ckpt = max(0, min(kept + new, cfg.save_total_limit + 1) - kept)
    ckpt = estimate_checkpoint_bytes(meta_model) if n_ckpt else 0
    final = 0
    if cfg.save_final_model:
        params = [p for p in meta_model.parameters() if (p.requires_grad or not cfg.lora)]
        final = sum(p.numel() * 4 for p in {id(p): p for p in params}.values())
    return n_ckpt * ckpt + final


def run(cfg: TrainConfig, *, capture: bool = False, timeout: float | None = None):
    """Check ``cfg``, launch ``cfg.nproc`` processes, wait, and return the finished run (``results.Run``).

    Raises ConfigError before launching on bad input, RuntimeError if the launched run fails.
    """
    from smolfsdp.launch.torchrun import launch

    preflight(cfg)
    proc = launch(cfg, capture=capture, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-4000:] if capture else "(see the output above)"
        raise RuntimeError(f"run {cfg.name!r} failed with exit code {proc.returncode}:\n{tail}")
    result = load_run(cfg.run_dir)
    result.log = proc.stdout if capture else None
    return result


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Body of one launched process: join the group, train, write the run folder (rank 0), tear down."""
    quiet.install()
    info = init_distributed(cpu_offload=cfg.cpu_offload)
    setup_logging(info.rank)
    torch.manual_seed(cfg.seed)
    writer = RunWriter(
        cfg.run_dir, enabled=info.is_main, resume=bool(cfg.resume_from), overwrite=cfg.overwrite
    )
    writer.write_config(cfg)
    torch.distributed.barrier()
    t0 = time.time()
    try:
        if cfg.engine == "native":
            from smolfsdp.train.native import run_native

            fields = run_native(cfg, info, writer)
        else:
            from smolfsdp.train.trl_engine import run_trl  # imports trl: only TRL runs pay for it

            fields = run_trl(cfg, info, writer)
        summary = {
            "name": cfg.name,
            "engine": cfg.engine,
            "world_size": info.world_size,
            "backend": info.backend,
            "device": info.device.type,
            "hardware": hardware(),
            "versions": versions(),
            "git_sha": git_sha(),
            "wall_time_s": round(time.time() - t0, 2),
            **fields,
        }
        writer.write_summary(summary)
        if info.is_main:
            _log_summary({**summary, "run_dir": writer.run_dir})
    finally:
        writer.close()
    teardown()
    return summary


def _log_summary(s: dict[str, Any]) -> None:
    eff, m = s["effective"], s["metrics"]
    log.info("requested %s, ran %s (%s)", s["requested"]["strategy"], eff["strategy"], eff["reason"])
    if "fraction_per_rank" in s.get("params", {}):
        log.info(
            "parameters held per rank: %s of %s",
            s["params"]["fraction_per_rank"],
            f"{s['params']['total']:,}",
        )
    if m.get("eval_loss_first") is None:
        log.info(
            "%d steps (%.1f s), no evaluation (eval_steps 0 or no eval rows); run folder written",
            m["steps"],
            m["train_runtime_s"],
        )
    else:
        log.info(
            "eval loss %.3f -> %.3f over %d steps (%.1f s); run folder written",
            m["eval_loss_first"],
            m["eval_loss_last"],
            m["steps"],
            m["train_runtime_s"],
        )
    note = stop_note(s, s["run_dir"]) if "run_dir" in s else None
    if note:
        log.info(note)


def stop_note(summary: dict[str, Any], run_dir) -> str | None:
    """One line for a run that ``stop_at_step`` ended early: the step, and what it can resume from.

    None for a run that finished. ``run_dir`` is ``runs/<name>`` (its ``checkpoints/`` is read). The
    CLI follows it with the exact command to resume (``cli.resume_command``).
    """
    from smolfsdp.checkpoint.dcp import latest_checkpoint

    m = summary.get("metrics", {})
    if not m.get("stopped_early"):
        return None
    head = f"stopped early at step {m['steps']} (stop_at_step): no final evaluation, no final model"
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return (
            f"{head}; no checkpoint was saved (save_steps 0), so it cannot resume: rerun with --save_steps N"
        )
    return (
        f"{head}; it can resume from {ckpt}: the same command without --stop_at_step, plus --resume "
        "(Python: sft.run(cfg.replace(stop_at_step=None, resume_from='latest')))"
    )
