"""The ``native`` engine: SmolLM3 fine-tuned in a plain PyTorch loop, sharded with FSDP1 or FSDP2.

This is the path that really shards on CPU (gloo), so the smoke profile shows FSDP, not DDP. It reads
as torchtitan's trainer does, one function per stage: :func:`build` (tokenizer, data, model, LoRA),
``shard_model`` (``smolfsdp.train.native_sharding``; with ``torch_compile`` each decoder layer is then compiled in
place, ``smolfsdp.train.speedups``), :func:`make_optimizer` and :func:`make_scheduler` (only after sharding), then
:class:`NativeTrainer`, whose ``train_step`` is one optimizer step top to bottom and whose ``train``
is the loop with evaluation and checkpoints; the final model (or the LoRA adapter) is gathered and
saved at the end. The step's arithmetic (the loss is the mean over the global batch, so gradients
equal a single-process run) is in ``smolfsdp.train.steps``, the batches in ``smolfsdp.train.batches``,
the export in ``smolfsdp.train.export``.

    torchrun --standalone --nproc-per-node 2 -m smolfsdp.cli train --config configs/runs/smoke.yaml
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm
from transformers import get_scheduler

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.config import TrainConfig
from smolfsdp.data.packing import (
    build_collator,
    count_computed_tokens,
    count_real_tokens,
    token_share,
    token_share_line,
)
from smolfsdp.data.prepare import prepare_data
from smolfsdp.measure import benchmark
from smolfsdp.models.modeling import build_model, count_parameters, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding.distributed import DistInfo, all_gather_object
from smolfsdp.sharding.lora import apply_lora, save_adapter
from smolfsdp.sharding.shards import local_tensors, storage_bytes
from smolfsdp.train import steps
from smolfsdp.train.batches import BatchStream, build_loader, count_steps
from smolfsdp.train.export import save_final_model
from smolfsdp.train.native_sharding import shard_model
from smolfsdp.train.speedups import apply_liger, apply_torch_compile, build_kwargs, run_options_record

log = logging.getLogger(__name__)


def build(cfg: TrainConfig) -> tuple[Any, Any, nn.Module]:
    """``(tokenizer, data, model)`` for ``cfg``: the prepared splits and the unsharded model (its attention
    kernel and Liger's kernels as the run options ask: ``smolfsdp.train.speedups``), with LoRA adapters when
    ``cfg.lora``. Parameters are fp32 always: with ``mixed_precision="bf16"``
    FSDP casts to bf16 for compute only."""
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
    data = prepare_data(cfg, tokenizer)
    log.info("building model %s%s", cfg.model, " with LoRA adapters" if cfg.lora else "")
    model = build_model(cfg.model, tokenizer, **build_kwargs(cfg))  # attn_implementation included
    if cfg.use_liger_kernel:  # Liger's RoPE, RMSNorm, SwiGLU kernels, as the Trainer applies them
        apply_liger(model)
    if cfg.lora:
        model = apply_lora(model, cfg)
    return tokenizer, data, model


def make_optimizer(model: nn.Module, cfg: TrainConfig, foreach=None, fused=None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters of the *sharded* model (so its state is sharded too).

    ``foreach=None`` is torch's own choice: foreach on CUDA, a per-parameter loop on CPU (``estimate.adamw_step``).
    The full-size dry run passes the step its engine runs on a GPU (``foreach=True``; TRL's ``fused=True``)."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        foreach=foreach,
        fused=fused,
    )


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """transformers' ``lr_scheduler_type`` schedule over ``total_steps``, warming up for
    ``ceil(warmup_ratio * total_steps)`` steps."""
    return get_scheduler(
        cfg.lr_scheduler_type,
        optimizer,
        num_warmup_steps=math.ceil(cfg.warmup_ratio * total_steps),
        num_training_steps=total_steps,
    )


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank really holds (storage, not numel): parameter shards, and Adam's m and v."""
    state = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"param_bytes": storage_bytes(local_tensors(model)), "optimizer_bytes": storage_bytes(state)}


class NativeTrainer:
    """One native run on the current process group, built, sharded and resumed on construction.

    ``train()`` runs the loop and returns the summary fields; ``train_step``, ``evaluate``,
    ``save_checkpoint`` and ``save_final`` are its stages. ``writer`` is the run folder's
    ``RunWriter`` (``metrics.jsonl``). Raises ValueError when the data make no full step.
    """

    def __init__(self, cfg: TrainConfig, info: DistInfo, writer):
        self.cfg, self.info, self.writer = cfg, info, writer
        self.tokenizer, self.data, model = build(cfg)
        self.total_params = count_parameters(model)
        self.trainable_params = count_parameters(model, trainable_only=True)
        # the decoder-layer class, resolved before FSDP2 renames it (FSDPSmolLM3DecoderLayer)
        wrap_cls = resolve_wrap_class(model, cfg.wrap_class)
        self.model, self.evidence = shard_model(model, cfg, info)
        self.local_numel = all_gather_object(self.evidence.pop("local_numel"))
        # torch_compile: each decoder layer compiled in place, after sharding (smolfsdp.train.speedups)
        self.compiled_layers = apply_torch_compile(self.model, cfg, wrap_cls)
        # The optimizer sees the sharded parameters: created only now, after wrapping.
        self.optimizer = make_optimizer(self.model, cfg)
        # TRL's collator, the one SFTTrainer builds: padded (right padding, labels -100, attention mask), or with
        # packing / padding_free one flattened row per micro-batch with position ids per row (data.packing)
        self.collator = build_collator(self.tokenizer.pad_token_id, cfg)
        loader, sampler = build_loader(self.data.train, self.collator, cfg, info)
        self.steps_per_epoch, self.total_steps = count_steps(len(loader), len(self.data.train), cfg, info)
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps)
        self.start_step, self.resumed_from, position = 0, None, {"epoch": 0, "consumed": 0}
        if cfg.resume_from:
            path = checkpoint.resolve_resume(cfg.resume_from, writer.run_dir)
            state = checkpoint.load_checkpoint(path, self.model, self.optimizer, self.scheduler)
            self.start_step, self.resumed_from = state["step"], str(path)
            position = {"epoch": state["epoch"], "consumed": state["consumed"]}
            log.info("resumed from %s at step %d", path, self.start_step)
        self.stream = BatchStream(loader, sampler, **position)
        if self.resumed_from:  # after the DataLoader iterator drew its seed
            checkpoint.restore_rng(self.resumed_from, info.rank)
        self.samples_per_step = (
            cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * info.world_size
        )
        ev = self.evidence
        log.info(
            f"model {cfg.model}: {self.total_params:,} parameters ({self.trainable_params:,} trainable), "
            f"{ev['fsdp_units']} FSDP units ({ev['parameter_type']}), {info.world_size} ranks; "
            f"{self.total_steps} steps of {self.samples_per_step} sequences"
        )
        self.meter, self.tokens_computed = None, 0  # input tokens computed by this launch's steps (all ranks)
        if cfg.benchmark_steps:  # per-step throughput and memory for bench.json
            self.meter = benchmark.StepMeter(cfg, info, self.model, self.total_params, self.trainable_params)

    def train_step(self, step: int) -> dict[str, Any]:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; its metrics record."""
        cfg, info, model, meter = self.cfg, self.info, self.model, self.meter
        t0 = time.perf_counter()
        if meter:
            meter.begin()
        micro = [next(self.stream) for _ in range(cfg.gradient_accumulation_steps)]
        with benchmark.phase("forward_backward", cfg.profile):
            loss, n_items = steps.forward_backward(
                model, micro, info.world_size, info.device, reduce_loss=False
            )
        with benchmark.phase("clip", cfg.profile):
            grad_norm = steps.clip_grad_norm(model, cfg.max_grad_norm, cfg.fsdp_version)
        with benchmark.phase("optimizer", cfg.profile):
            # the lr this step applied, read before the scheduler moves on (what the Trainer logs since
            # transformers PR #36973; logging after ``scheduler.step()`` shows the next step's lr)
            lr = float(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.scheduler.step()
            scan_s = self._meter_held_bytes()
            self.optimizer.zero_grad(set_to_none=True)
        if info.device.type == "cuda":
            torch.cuda.synchronize(info.device)
        step_ms = (time.perf_counter() - t0 - scan_s) * 1e3
        return self._step_record(step, micro, loss, n_items, lr, grad_norm, step_ms)

    def _meter_held_bytes(self) -> float:
        """In benchmark mode, the bytes held after the optimizer step (a walk over every tensor, before
        ``zero_grad``); returns the seconds the walk took, which the step time leaves out (0 otherwise)."""
        if not self.meter:
            return 0.0
        t_scan = time.perf_counter()
        self.meter.after_optimizer(self.model, self.optimizer)
        return time.perf_counter() - t_scan

    def _step_record(self, step, micro, loss, n_items, lr, grad_norm, step_ms) -> dict[str, Any]:
        """The step's ``metrics.jsonl`` record: loss and non-padding input tokens over all ranks (one small
        all-reduce, after the step is timed), and in benchmark mode the meter's throughput and memory."""
        info = self.info
        tokens = sum(count_real_tokens(b) for b in micro)
        computed = sum(count_computed_tokens(b) for b in micro)
        stats = torch.tensor([loss, tokens, computed], device=info.device, dtype=torch.float64)
        dist.all_reduce(stats)
        record = {
            "split": "train",
            "step": step,
            "epoch": round(step / max(self.steps_per_epoch, 1), 4),
            "loss": float(stats[0]),
            "learning_rate": lr,
            "grad_norm": grad_norm,
            "step_time_ms": step_ms,
            "tokens": int(stats[1]),
            "tokens_computed": int(stats[2]),
            "label_tokens": n_items,
            "samples": self.samples_per_step,
        }
        if self.meter:
            record.update(self.meter.metrics(step, step_ms, record["tokens"], record["samples"], micro))
        return record

    def evaluate(self, step: int) -> float | None:
        """Eval loss over the whole eval split, logged at ``step``; None without an eval split and in
        benchmark mode (which times training steps only)."""
        if self.data.eval is None or self.cfg.benchmark_steps:
            return None
        loss = steps.evaluate(
            self.model, self.data.eval, self.collator, self.cfg.per_device_eval_batch_size, self.info
        )
        self.writer.log({"split": "eval", "step": step, "eval_loss": loss})
        if self.info.is_main:  # as the Trainer prints its eval dict: a line per evaluation, not only the file
            log.info(
                f"eval at step {step}/{self.total_steps}: eval_loss {loss:.4f} over {len(self.data.eval)} rows"
            )
        return loss

    def save_checkpoint(self, step: int) -> None:
        """A sharded DCP checkpoint of model, optimizer, scheduler, data position and RNG at ``step``."""
        ckpt = checkpoint.save_checkpoint(
            self.writer.run_dir,
            step,
            self.model,
            self.optimizer,
            self.scheduler,
            self.stream.position(),
            self.info.rank,
            keep=self.cfg.save_total_limit,
            config=self.cfg,
        )
        log.info("checkpoint %s", ckpt)

    def save_final(self) -> tuple[Path, dict[str, Any] | None]:
        """``final_model/``: the gathered full model, or with LoRA the PEFT adapter (returns its fields)."""
        final_dir = self.writer.run_dir / "final_model"
        if self.cfg.lora:
            return final_dir, save_adapter(self.model, final_dir, self.info, self.cfg, self.tokenizer)
        save_final_model(self.model, self.tokenizer, final_dir, self.info)
        return final_dir, None

    def train(self) -> dict[str, Any]:
        """Steps ``start_step + 1`` to ``total_steps`` (or ``stop_at_step``), evaluating and saving
        checkpoints on the configured steps; then the final eval and model. Returns the summary fields."""
        cfg = self.cfg
        prof = benchmark.start_profiler(cfg, self.info, self.writer.run_dir)
        if prof is not None:
            run_dir = self.writer.run_dir
            log.info(
                benchmark.PROFILING_LINE, cfg.profile_wait, cfg.profile_warmup, cfg.profile_active, run_dir
            )
        evals = [(self.start_step, self.evaluate(self.start_step))] if cfg.eval_on_start else []
        train_losses, tokens, computed, t_train = [], 0, 0, time.perf_counter()
        last_step = min(self.total_steps, cfg.stop_at_step or self.total_steps)
        bar = tqdm(
            total=self.total_steps,
            initial=self.start_step,
            desc="train",
            disable=not self.info.is_main,
            dynamic_ncols=True,
        )
        for step in range(self.start_step + 1, last_step + 1):
            record = self.train_step(step)
            train_losses.append(record["loss"])
            tokens, computed = tokens + record["tokens"], computed + record["tokens_computed"]
            if prof is not None:
                prof.step()
            if step % cfg.logging_steps == 0 or step == self.total_steps:
                self.writer.log(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}")
            bar.update()
            if steps.is_eval_step(step, self.total_steps, cfg.eval_steps) and step != self.total_steps:
                evals.append((step, self.evaluate(step)))  # the last step's comes after the profiler stops
            if cfg.save_steps > 0 and step % cfg.save_steps == 0:
                self.save_checkpoint(step)
        bar.close()
        benchmark.stop_profiler(prof)
        if self.meter:
            self.meter.write(self.writer.run_dir, f"fsdp{cfg.fsdp_version}", self.evidence)
        stopped_early = last_step < self.total_steps
        if not stopped_early:
            evals.append((self.total_steps, self.evaluate(self.total_steps)))
        train_time = time.perf_counter() - t_train
        final_dir, adapter = self.save_final() if cfg.save_final_model and not stopped_early else (None, None)
        metrics = {
            "steps": last_step,
            "optimizer_step": max(
                (int(st["step"]) for st in self.optimizer.state.values() if "step" in st), default=0
            ),
            "resumed_from": self.resumed_from,
            "stopped_early": stopped_early,
            "train_loss_first": train_losses[0] if train_losses else None,
            "train_loss_last": train_losses[-1] if train_losses else None,
            **steps.eval_metrics([(step, loss) for step, loss in evals if loss is not None]),
            "train_runtime_s": round(train_time, 2),
            "tokens": tokens,
            "tokens_per_s": round(tokens / train_time, 1),
        }
        self.tokens_computed = computed
        return self.summary(metrics, final_dir, adapter)

    def summary(self, metrics: dict[str, Any], final_dir: Path | None, adapter: dict | None) -> dict:
        """The engine's fields of ``summary.json``: requested vs effective strategy with the wrap's
        evidence, parameters and bytes held per rank (an all-gather), data and ``metrics``."""
        cfg, total = self.cfg, self.total_params
        strategy = f"fsdp{cfg.fsdp_version}"
        return {
            "requested": {
                "engine": "native",
                "strategy": strategy,
                "sharding_strategy": cfg.sharding_strategy,
                "lora": cfg.lora,
            },
            "effective": {
                "strategy": strategy,
                "reason": "native engine: torch.distributed.fsdp shards on any backend, gloo included",
                "evidence": self.evidence,
            },
            "params": {
                "total": total,
                "trainable": self.trainable_params,
                "local_numel_per_rank": self.local_numel,
                "fraction_per_rank": [round(n / total, 4) for n in self.local_numel],
            },
            "memory_per_rank": all_gather_object(held_bytes(self.model, self.optimizer)),
            "run_options": run_options_record(cfg, self.model, self.compiled_layers),
            "data": {**self.data.stats(), **self.token_fields(metrics)},
            "metrics": metrics,
            "final_model": str(final_dir) if final_dir and not cfg.lora else None,
            "adapter": adapter,
        }

    def token_fields(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``data``'s real-token share over the steps this launch ran (``data.packing.token_share``); rank 0
        logs it."""
        fields = token_share(self.cfg, metrics["tokens"], self.tokens_computed)
        if self.info.is_main:
            log.info(token_share_line(fields))
        return fields


def run_native(cfg: TrainConfig, info: DistInfo, writer) -> dict[str, Any]:
    """Train ``cfg`` with the native engine on the current process group; return summary fields."""
    return NativeTrainer(cfg, info, writer).train()
