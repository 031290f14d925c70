"""The TRL engine's ``SFTTrainer``, with smolfsdp's checkpoints and benchmark mode.

Two things the stock Trainer does not do the way this book needs:

* **Checkpoints.** The Trainer writes ``checkpoint-N/`` in place: a save killed half-way leaves a
  folder that looks like a checkpoint, and ``resume_from_checkpoint=True`` picks it up. Here
  ``_save_checkpoint`` writes the same atomic torch.distributed.checkpoint (DCP) save as the native
  engine (``smolfsdp.checkpoint.dcp.atomic_save``: ``step-N.tmp/``, a ``COMPLETE`` marker, a rename,
  keep-last-K), with the model and optimizer state from ``torch.distributed.checkpoint.state_dict``
  (the same call for DDP, FSDP1 and FSDP2, each rank writing only its shards), the scheduler, the
  Trainer's ``TrainerState`` and its per-rank RNG files. Resume goes through the Trainer's own path
  (``train(resume_from_checkpoint=...)``: global step, data skipping, RNG), with the two loaders it
  calls replaced to read DCP.
* **Benchmark mode.** ``BenchmarkCallback`` times each optimizer step (batch fetch + forward +
  backward + clip + optimizer) with ``smolfsdp.measure.benchmark.StepMeter``, as the native loop does, and
  steps the profiler; the Trainer's micro-batches are seen through ``get_batch_samples``.

    smolfsdp train --engine trl --save_steps 3 --stop_at_step 3
    smolfsdp train --engine trl --resume_from latest
    smolfsdp bench --engine trl --benchmark_steps 5 --profile true
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from transformers import TrainerCallback
from trl import SFTTrainer

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.data.packing import count_computed_tokens, count_real_tokens, token_share, token_share_line
from smolfsdp.measure.benchmark import StepMeter
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.train import steps

SCHEDULER_FILE = "scheduler.json"
log = logging.getLogger(__name__)


def _inner_optimizer(optimizer):
    """accelerate wraps the torch optimizer in ``AcceleratedOptimizer``; DCP needs the torch one."""
    return getattr(optimizer, "optimizer", optimizer)


class SmolSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose checkpoints are atomic DCP saves in ``runs/<name>/checkpoints/step-N``.

    Args (besides SFTTrainer's):
        smol_cfg: the run's ``TrainConfig`` (saved with each checkpoint; ``save_total_limit`` = K).
        run_dir: ``runs/<name>``.
    """

    def __init__(self, *args, smol_cfg=None, run_dir: str | Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.smol_cfg = smol_cfg
        self.smol_run_dir = Path(run_dir) if run_dir is not None else Path(self.args.output_dir)
        self.last_batch: list[dict[str, torch.Tensor]] = []  # the step's micro-batches (benchmark)
        self.fetch_s = 0.0  # time the step's get_batch_samples took
        self.tokens_real = self.tokens_computed = 0  # this rank's, this launch's training micro-batches

    def get_eval_dataloader(self, eval_dataset=None):
        """Every eval row, as the native engine evaluates them. ``dataloader_drop_last`` (set for training's
        full batches) would also drop the eval split's last partial batch, and with fewer eval rows than
        one batch per rank every row: an evaluation without a loss. accelerate's ``even_batches`` keeps the
        ranks' eval batch counts equal without it."""
        drop, self.args.dataloader_drop_last = self.args.dataloader_drop_last, False
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.args.dataloader_drop_last = drop

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Eval loss as the native engine computes it (``steps.evaluate``): every row once, the token-weighted
        mean over all label tokens. The Trainer's own loop pads the ranks' shards by repeating rows
        (accelerate's ``even_batches``) and averages per-batch means, so with 7 rows on 2 ranks it counted one
        row twice and gave 6.950521 for 6.951163. Logged as ``{metric_key_prefix}_loss``; the callbacks'
        ``on_evaluate`` runs as in the Trainer's ``evaluate``."""
        info = DistInfo(
            rank=self.args.process_index,
            world_size=self.args.world_size,
            local_rank=self.args.local_process_index,
            device=self.args.device,
            backend="",
        )
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset
        if self.args.remove_unused_columns:  # what get_eval_dataloader would hand the collator
            ds = self._remove_unused_columns(ds, description="evaluation")
        model = self.model_wrapped if self.model_wrapped is not None else self.model
        loss = steps.evaluate(model, ds, self.data_collator, self.args.per_device_eval_batch_size, info)
        metrics = {f"{metric_key_prefix}_loss": loss}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def token_fields(self) -> dict[str, Any]:
        """``data``'s real-token share over this launch's training micro-batches, all ranks
        (``data.packing.token_share``; an all-reduce: call on every rank); rank 0 logs it."""
        counts = torch.tensor(
            [self.tokens_real, self.tokens_computed], dtype=torch.int64, device=self.args.device
        )
        if dist.is_initialized():
            dist.all_reduce(counts)
        fields = token_share(self.smol_cfg, int(counts[0]), int(counts[1]))
        if self.args.should_save:
            log.info(token_share_line(fields))
        return fields

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial) -> None:
        """Replaces the Trainer's in-place ``checkpoint-N/`` with an atomic DCP save (all ranks)."""
        wrapped = self.model_wrapped
        optimizer = _inner_optimizer(self.optimizer)
        rank = self.args.process_index

        def write(tmp: Path) -> None:
            state = {
                "model": get_model_state_dict(wrapped),
                "optim": get_optimizer_state_dict(wrapped, optimizer),
            }
            dcp.save(state, checkpoint_id=str(tmp))
            self._save_rng_state(str(tmp))  # rng_state_<rank>.pth: python, numpy, torch (and CUDA)
            if self.args.should_save:  # rank 0
                (tmp / SCHEDULER_FILE).write_text(json.dumps(self.lr_scheduler.state_dict()))
                self.state.save_to_json(str(tmp / "trainer_state.json"))

        path = checkpoint.atomic_save(
            self.smol_run_dir,
            self.state.global_step,
            rank,
            write,
            keep=self.smol_cfg.save_total_limit if self.smol_cfg is not None else None,
            config=self.smol_cfg,
        )
        if self.args.should_save:
            print(f"checkpoint {path}", flush=True)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Model weights from a DCP checkpoint (the Trainer calls this before or after wrapping)."""
        model = model if model is not None else self.model
        state = {"model": get_model_state_dict(model)}
        checkpoint.dcp_load(state, resume_from_checkpoint)  # allow-list unpickler
        set_model_state_dict(model, state["model"])

    def _load_optimizer_and_scheduler(self, checkpoint_path: str | None) -> None:
        """AdamW state from the DCP checkpoint, the scheduler from ``scheduler.json``."""
        if checkpoint_path is None:
            return
        optimizer = _inner_optimizer(self.optimizer)
        state = {"optim": get_optimizer_state_dict(self.model_wrapped, optimizer)}
        checkpoint.dcp_load(state, checkpoint_path)
        set_optimizer_state_dict(self.model_wrapped, optimizer, state["optim"])
        sched = json.loads((Path(checkpoint_path) / SCHEDULER_FILE).read_text())
        self.lr_scheduler.load_state_dict(sched)

    # ------------------------------------------------------------------ benchmark hooks
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        t0 = time.perf_counter()
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.fetch_s = time.perf_counter() - t0
        self.last_batch = batches
        # this rank's real and computed input tokens (smolfsdp.data.packing), summed over ranks at the end
        self.tokens_real += sum(count_real_tokens(b) for b in batches)
        self.tokens_computed += sum(count_computed_tokens(b) for b in batches)
        return batches, num_items


class StopAtStepCallback(TrainerCallback):
    """End training after ``stop_at_step`` optimizer steps, as if the run had been killed there.

    The checkpoint the step's ``save_steps`` asks for is still written (the Trainer saves after
    ``on_step_end``); the caller skips the final model.
    """

    def __init__(self, stop_at_step: int):
        self.stop_at_step = stop_at_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.stop_at_step:
            control.should_training_stop = True
        return control


class BenchmarkCallback(TrainerCallback):
    """Benchmark mode for the TRL engine: the native loop's ``StepMeter`` on the Trainer's steps.

    Step time = the step's batch fetch (``get_batch_samples``) + ``on_step_begin`` .. ``on_step_end``
    (forward, backward, clip, optimizer, scheduler, ``zero_grad``), minus the meter's own scan of
    the tensors held (done after ``optimizer.step``, before ``zero_grad``); on CUDA the device is
    synchronised before the clock stops. Tokens are counted from the step's micro-batches on this
    rank and summed over ranks.
    """

    def __init__(self, cfg, info, model, n_params: int, trainable: int, prof=None):
        self.meter = StepMeter(cfg, info, model, n_params, trainable)
        self.info, self.prof = info, prof
        self.trainer: SmolSFTTrainer | None = None
        self._t0 = 0.0
        self._scan_s = 0.0
        self.records: list[dict[str, Any]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.meter.begin()
        self._scan_s = 0.0
        self._t0 = time.perf_counter()

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        t = time.perf_counter()
        self.meter.after_optimizer(self.trainer.model_wrapped, _inner_optimizer(self.trainer.optimizer))
        self._scan_s = time.perf_counter() - t

    def on_step_end(self, args, state, control, **kwargs):
        if self.info.device.type == "cuda":
            torch.cuda.synchronize(self.info.device)
        step_ms = (time.perf_counter() - self._t0 - self._scan_s + self.trainer.fetch_s) * 1e3
        micro = self.trainer.last_batch
        rows = self.trainer.args.per_device_train_batch_size * len(
            micro
        )  # rows the loader gave (packed rows)
        counts = torch.tensor(
            [sum(count_real_tokens(b) for b in micro), rows],
            dtype=torch.int64,
            device=self.info.device,
        )
        if dist.is_initialized():
            dist.all_reduce(counts)
        tokens, samples = int(counts[0]), int(counts[1])
        row = self.meter.metrics(state.global_step, step_ms, tokens, samples, micro)
        self.records.append({"step": state.global_step, "step_time_ms": step_ms, **row})
        if self.prof is not None:
            self.prof.step()
        return control
