"""The fine-tune: SmolLM3 on medical Q&A, with the TRL engine or the native engine.

``train(cfg)`` is what each launched process runs. Chapters and tests start a run with
:func:`smolfsdp.launch.runner.run`, which checks the configuration before anything starts
(``runner.preflight``), launches ``cfg.nproc`` processes with torchrun, and returns the run's summary.

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
from smolfsdp.checkpoint.dcp import latest_checkpoint
from smolfsdp.config import TrainConfig
from smolfsdp.measure import benchmark
from smolfsdp.measure.results import RunWriter, git_sha, hardware, versions
from smolfsdp.sharding.distributed import all_gather_object, init_distributed, setup_logging, teardown
from smolfsdp.train.native import run_native

log = logging.getLogger(__name__)


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
            fields = run_native(cfg, info, writer)
        else:
            from smolfsdp.train.trl_engine import run_trl  # deferred: imports trl, only TRL runs pay for it

            fields = run_trl(cfg, info, writer)
        peaks = all_gather_object(benchmark.peak_memory(info.device))  # a collective: every rank
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
            "peak_memory_per_rank": peaks,
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
            " / ".join(f"{f:.0%}" for f in s["params"]["fraction_per_rank"]),
            f"{s['params']['total']:,}",
        )
    if m.get("eval_loss_first") is None:
        log.info(
            "%d steps (%.1f s), no evaluation (no eval rows, benchmark mode, or stopped early without "
            "eval_on_start); run folder written",
            m["steps"],
            m["train_runtime_s"],
        )
    else:
        log.info(
            "%s over %d steps (%.1f s); run folder written",
            eval_headline(m),
            m["steps"],
            m["train_runtime_s"],
        )
    note = stop_note(s, s["run_dir"]) if "run_dir" in s else None
    if note:
        log.info(note)


def eval_headline(m: dict[str, Any]) -> str:
    """``eval loss 6.946 (step 0) -> 5.370 (step 108)`` from a summary's metrics: the first and last evaluation
    and the steps they were taken at (one evaluation: ``eval loss 5.370 (step 108)``)."""
    first = f"{m['eval_loss_first']:.3f} (step {m.get('eval_step_first')})"
    if m.get("eval_step_first") == m.get("eval_step_last"):
        return f"eval loss {first}"
    return f"eval loss {first} -> {m['eval_loss_last']:.3f} (step {m.get('eval_step_last')})"


def stop_note(summary: dict[str, Any], run_dir) -> str | None:
    """One line for a run that ``stop_at_step`` ended early: the step, and what it can resume from.

    None for a run that finished. ``run_dir`` is ``runs/<name>`` (its ``checkpoints/`` is read). The
    CLI follows it with the exact command to resume (``cli.resume_command``).
    """
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
        "(Python: runner.run(cfg.replace(stop_at_step=None, resume_from='latest')))"
    )
