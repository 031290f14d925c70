"""The ``native`` engine: SmolLM3 fine-tuned in a plain PyTorch loop, sharded with FSDP1 or FSDP2.

This is the path that really shards on CPU (gloo), so the smoke profile shows FSDP, not DDP. The
loop is explicit: build, shard, then create the optimizer; each step all-reduces the number of
label tokens so the loss is the mean over the global batch (gradients then equal a single-process
run on the full batch); eval runs on every rank in lock-step; the final model is gathered to rank 0
and saved with ``save_pretrained``.

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
from torch.utils.data import DataLoader, DistributedSampler

from smolfsdp.data.prepare import IGNORE_INDEX, prepare_data
from smolfsdp.models.modeling import (
    build_model,
    count_parameters,
    decoder_layers,
    load_tokenizer,
    resolve_wrap_class,
)
from smolfsdp.paths import umask_modes
from smolfsdp.sharding.distributed import DistInfo, all_gather_object
from smolfsdp.sharding.shards import (
    apply_activation_checkpointing as _apply_activation_checkpointing,
)
from smolfsdp.sharding.shards import local_tensors, storage_bytes

log = logging.getLogger(__name__)


class PadCollator:
    """Right-pad ``input_ids`` with ``pad_id`` and ``labels`` with -100; build the attention mask."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), n), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            k = len(r["input_ids"])
            ids[i, :k] = torch.tensor(r["input_ids"])
            labels[i, :k] = torch.tensor(r["labels"])
            mask[i, :k] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def shard_model(model: nn.Module, cfg, info: DistInfo) -> tuple[nn.Module, dict[str, Any]]:
    """Wrap ``model`` with FSDP1 or FSDP2 as ``cfg`` asks; return it and evidence of what happened.

    The data-parallel mesh is ``(replicate, shard)`` from ``cfg.sharding_strategy`` and the real world
    size (``fsdp2.resolve_mesh_shape``; ``LOCAL_WORLD_SIZE`` = processes per node for HYBRID_SHARD's
    default). FSDP2 gets a 2-D mesh for HYBRID_SHARD and NO_SHARD, a 1-D one otherwise, and
    ``reshard_after_forward=False`` for SHARD_GRAD_OP; FSDP1 gets the strategy by name and, for
    HYBRID_SHARD, the 2-D mesh. Raises ConfigError when the mesh does not fit the world size.
    """
    import os

    from smolfsdp.sharding import fsdp2

    wrap_cls = resolve_wrap_class(model, cfg.wrap_class)
    n_layers = len(decoder_layers(model, wrap_cls))
    param_dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else None
    strategy = cfg.sharding_strategy
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    replicate, shard = fsdp2.resolve_mesh_shape(
        strategy, info.world_size, cfg.replicate_size, cfg.shard_size, local_world_size=local_world
    )
    two_d = strategy in ("HYBRID_SHARD", "NO_SHARD")
    reshard = cfg.reshard_after_forward and strategy != "SHARD_GRAD_OP"
    two_d_fsdp1 = strategy == "HYBRID_SHARD"  # FSDP1 takes NO_SHARD by name, on the default group
    if cfg.activation_checkpointing and cfg.fsdp_version == 2:
        _apply_activation_checkpointing(model, wrap_cls)
    if cfg.fsdp_version == 1:
        from smolfsdp.sharding import fsdp1

        model = fsdp1.wrap_fsdp1(
            model,
            wrap_cls,
            device=info.device,
            sharding_strategy=strategy,
            device_mesh=fsdp2.build_mesh(info.device.type, shard, replicate) if two_d_fsdp1 else None,
            backward_prefetch=cfg.backward_prefetch,
            cpu_offload=cfg.cpu_offload,
            param_dtype=param_dtype,
            use_orig_params=cfg.use_orig_params,
        )
        units, local = len(fsdp1.fsdp_units(model)), fsdp1.local_numel(model)
        param_type = "FlatParameter"
        reshard = strategy in ("FULL_SHARD", "HYBRID_SHARD")  # FSDP1: fixed by the strategy
    else:
        mesh = fsdp2.build_mesh(info.device.type, shard, replicate if two_d else None)
        offload = fsdp2.make_offload_policy() if cfg.cpu_offload else None
        # No model.to(device) first: each fully_shard call moves only its own group's parameters to the
        # mesh's device, shards them (and with offload puts the shards back on the host), so the device
        # never holds the whole model (torch/distributed/fsdp/_fully_shard/_fsdp_init.py).
        fsdp2.apply_fsdp2(
            model,
            mesh,
            wrap_cls,
            mp_policy=fsdp2.default_mp_policy(cfg.mixed_precision),
            offload_policy=offload,
            reshard_after_forward=reshard,
        )
        units, local = len(fsdp2.fsdp_units(model)), fsdp2.local_numel(model)
        param_type = "DTensor"
    if cfg.activation_checkpointing and cfg.fsdp_version == 1:
        _apply_activation_checkpointing(model, wrap_cls)
    evidence = {
        "wrap_class": wrap_cls.__name__,
        "decoder_layers": n_layers,
        "fsdp_units": units,
        "parameter_type": param_type,
        "sharding_strategy": strategy,
        # the data-parallel layout that ran: FSDP2's DeviceMesh, or FSDP1's process groups in the same shape
        "mesh_shape": [replicate, shard] if two_d else [shard],
        "mesh_dim_names": list(fsdp2.MESH_DIM_NAMES) if two_d else ["dp_shard"],
        "reshard_after_forward": reshard,
    }
    return model, {**evidence, "local_numel": local}


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def count_label_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that carry a loss after the causal shift (what HF's ForCausalLMLoss averages over)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def forward_backward(
    model: nn.Module,
    micro_batches: list[dict[str, torch.Tensor]],
    world_size: int,
    device: torch.device,
    reduce_loss: bool = True,
) -> tuple[float, int]:
    """Forward and backward over this rank's micro-batches of one optimizer step.

    The loss of each micro-batch is its summed token loss divided by the label tokens of the whole
    global batch (all ranks, all micro-batches; one all-reduce), times ``world_size`` because FSDP
    averages gradients over ranks. The gradient is then exactly that of the mean token loss over the
    global batch, as in a single-process run. Returns ``(global mean loss, global label tokens)``;
    with ``reduce_loss=False`` the loss is this rank's share (sum it over ranks to get the mean),
    so the training loop can fold that all-reduce into its per-step one.
    """
    local_items = torch.tensor([sum(count_label_tokens(b) for b in micro_batches)], device=device)
    dist.all_reduce(local_items)
    n_items = int(local_items.item())
    total = torch.zeros((), device=device)
    for batch in micro_batches:
        out = model(**_to(batch, device), num_items_in_batch=max(n_items, 1))
        (out.loss * world_size).backward()
        total += out.loss.detach().float()
    if reduce_loss:
        dist.all_reduce(total)
    return float(total.item()), n_items


@torch.no_grad()
def evaluate(model: nn.Module, eval_ds, collator, batch_size: int, info: DistInfo) -> float:
    """Mean token loss over the whole eval split. Rows are split over ranks; ranks with fewer rows
    run fully-masked batches so every rank makes the same number of FSDP forward calls."""
    model.eval()
    idx = list(range(info.rank, len(eval_ds), info.world_size))
    n_batches = math.ceil(math.ceil(len(eval_ds) / info.world_size) / batch_size)
    sums = torch.zeros(2, device=info.device, dtype=torch.float64)
    for b in range(n_batches):
        rows = [eval_ds[i] for i in idx[b * batch_size : (b + 1) * batch_size]]
        if not rows:  # keep collectives in step: one row, no labels
            rows = [{**eval_ds[0], "labels": [IGNORE_INDEX] * len(eval_ds[0]["labels"])}]
        batch = collator(rows)
        n = count_label_tokens(batch)
        out = model(**_to(batch, info.device), num_items_in_batch=1)  # loss = summed token loss
        sums += torch.tensor(
            [out.loss.double().item() if n else 0.0, n], device=info.device, dtype=torch.float64
        )
    dist.all_reduce(sums)
    model.train()
    return float(sums[0] / sums[1])


def clip_grad_norm(model: nn.Module, max_norm: float, fsdp_version: int) -> float:
    if fsdp_version == 1:
        return float(model.clip_grad_norm_(max_norm))
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def save_final_model(model: nn.Module, tokenizer, out_dir: Path, info: DistInfo) -> None:
    """Gather the full state dict to rank 0 (a collective) and save it with ``save_pretrained``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload=True moves the gathered tensors to host memory on GPU runs; on a CPU-only FSDP1 run
    # (torch 2.13, gloo) it crashes rank 0 with SIGSEGV, and the tensors are on the host already.
    offload = info.device.type == "cuda"
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if info.is_main:
        inner = getattr(model, "module", model)
        # Tied weights (SmolLM3's lm_head = embed_tokens) are saved once, as from_pretrained expects;
        # the gathered state dict holds them under both names.
        for name in tied_duplicates(inner):
            state.pop(name, None)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        inner.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        umask_modes(tmp)  # safetensors writes 0600
        _replace_dir(tmp, out_dir)
    dist.barrier()


def tied_duplicates(model: nn.Module) -> list[str]:
    """Clean names of parameters that are the same tensor as an earlier parameter (tied weights)."""
    seen, dupes = set(), []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            dupes.append(name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", ""))
        seen.add(id(p))
    return dupes


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move a finished ``tmp`` into place; an existing ``out_dir`` is removed only after that."""
    import shutil

    old = out_dir.with_name(out_dir.name + ".old")
    if out_dir.exists():
        out_dir.replace(old)
    tmp.replace(out_dir)
    shutil.rmtree(old, ignore_errors=True)


class BatchStream:
    """Micro-batches in a fixed order (sampler seed + epoch), resumable at any position."""

    def __init__(self, loader: DataLoader, sampler: DistributedSampler, epoch: int = 0, consumed: int = 0):
        self.loader, self.sampler = loader, sampler
        self.epoch, self.consumed = epoch, 0
        self._start(epoch)
        for _ in range(consumed):  # replay the data order up to where a checkpoint stopped
            next(self)

    def _start(self, epoch: int) -> None:
        self.epoch, self.consumed = epoch, 0
        self.sampler.set_epoch(epoch)
        self._it = iter(self.loader)

    def __next__(self) -> dict[str, torch.Tensor]:
        try:
            batch = next(self._it)
        except StopIteration:
            self._start(self.epoch + 1)
            batch = next(self._it)
        self.consumed += 1
        return batch


def run_native(cfg, info: DistInfo, writer) -> dict[str, Any]:
    """Train ``cfg`` with the native engine on the current process group; return summary fields."""
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    from smolfsdp.checkpoint import dcp as checkpoint

    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
    data = prepare_data(cfg, tokenizer)
    # fp32 parameters always: with mixed_precision="bf16" FSDP casts to bf16 for compute only.
    model = build_model(cfg.model, tokenizer, seed=cfg.seed, trust_remote_code=cfg.trust_remote_code)
    if cfg.lora:
        from smolfsdp.sharding.lora import apply_lora

        model = apply_lora(model, cfg)
    total_params = count_parameters(model)
    trainable_params = count_parameters(model, trainable_only=True)
    model, evidence = shard_model(model, cfg, info)
    local = all_gather_object(evidence.pop("local_numel"))
    # The optimizer sees the sharded parameters: created only now, after wrapping.
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
    )

    collator = PadCollator(tokenizer.pad_token_id)
    sampler = DistributedSampler(
        data.train, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    loader = DataLoader(
        data.train,
        batch_size=cfg.per_device_train_batch_size,
        sampler=sampler,
        collate_fn=collator,
        drop_last=True,
    )
    steps_per_epoch = len(loader) // cfg.gradient_accumulation_steps
    if steps_per_epoch == 0 and cfg.max_steps <= 0:
        raise ValueError(
            f"{len(data.train)} training rows make no full step of "
            f"{cfg.per_device_train_batch_size} x {info.world_size} ranks x "
            f"{cfg.gradient_accumulation_steps}; lower the batch size or add rows."
        )
    total_steps = cfg.max_steps if cfg.max_steps > 0 else math.ceil(cfg.num_train_epochs * steps_per_epoch)
    scheduler = get_scheduler(
        cfg.lr_scheduler_type,
        optimizer,
        num_warmup_steps=math.ceil(cfg.warmup_ratio * total_steps),
        num_training_steps=total_steps,
    )
    start_step, resumed_from = 0, None
    stream_pos = {"epoch": 0, "consumed": 0}
    if cfg.resume_from:
        path = checkpoint.resolve_resume(cfg.resume_from, writer.run_dir)
        state = checkpoint.load_checkpoint(path, model, optimizer, scheduler)
        start_step, resumed_from = state["step"], str(path)
        stream_pos = {"epoch": state["epoch"], "consumed": state["consumed"]}
        log.info("resumed from %s at step %d", path, start_step)
    stream = BatchStream(loader, sampler, **stream_pos)
    if resumed_from:
        checkpoint.restore_rng(resumed_from, info.rank)  # after the DataLoader iterator drew its seed
    log.info(
        "model %s: %s parameters (%s trainable), %d FSDP units (%s), %d ranks; %d steps of %d sequences",
        cfg.model,
        f"{total_params:,}",
        f"{trainable_params:,}",
        evidence["fsdp_units"],
        evidence["parameter_type"],
        info.world_size,
        total_steps,
        cfg.per_device_train_batch_size * info.world_size * cfg.gradient_accumulation_steps,
    )

    def run_eval(step: int) -> float | None:
        if data.eval is None or cfg.benchmark_steps:  # benchmark mode times training steps only
            return None
        loss = evaluate(model, data.eval, collator, cfg.per_device_eval_batch_size, info)
        writer.log({"split": "eval", "step": step, "eval_loss": loss})
        return loss

    from smolfsdp.measure import benchmark

    meter = (
        benchmark.StepMeter(cfg, info, model, total_params, trainable_params) if cfg.benchmark_steps else None
    )
    prof = benchmark.start_profiler(cfg, info, writer.run_dir)
    eval_losses = [run_eval(start_step)]
    train_losses, tokens_total, t_train = [], 0, time.perf_counter()
    last_step = min(total_steps, cfg.stop_at_step or total_steps)
    bar = tqdm(
        total=total_steps, initial=start_step, desc="train", disable=not info.is_main, dynamic_ncols=True
    )
    for step in range(start_step + 1, last_step + 1):
        t0 = time.perf_counter()
        if meter:
            meter.begin()
        micro = [next(stream) for _ in range(cfg.gradient_accumulation_steps)]
        with benchmark.phase("forward_backward", cfg.profile):
            loss, n_items = forward_backward(model, micro, info.world_size, info.device, reduce_loss=False)
        with benchmark.phase("clip", cfg.profile):
            grad_norm = clip_grad_norm(model, cfg.max_grad_norm, cfg.fsdp_version)
        with benchmark.phase("optimizer", cfg.profile):
            optimizer.step()
            scheduler.step()
            scan_s = 0.0
            if meter:  # bytes held (a walk over every tensor): measured, then left out of the step time
                t_scan = time.perf_counter()
                meter.after_optimizer(model, optimizer)
                scan_s = time.perf_counter() - t_scan
            optimizer.zero_grad(set_to_none=True)
        if info.device.type == "cuda":
            torch.cuda.synchronize(info.device)
        step_ms = (time.perf_counter() - t0 - scan_s) * 1e3
        # loss and non-padding input tokens over all ranks: one small all-reduce, after the step is timed
        stats = torch.tensor(
            [loss, sum(int(b["attention_mask"].sum()) for b in micro)],
            device=info.device,
            dtype=torch.float64,
        )
        dist.all_reduce(stats)
        loss, tokens = float(stats[0]), int(stats[1])
        tokens_total += tokens
        train_losses.append(loss)
        record = {
            "split": "train",
            "step": step,
            "epoch": round(step / max(steps_per_epoch, 1), 4),
            "loss": loss,
            "learning_rate": scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            "step_time_ms": step_ms,
            "tokens": tokens,
            "label_tokens": n_items,
            "samples": cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * info.world_size,
        }
        if meter:
            record.update(meter.metrics(step, step_ms, tokens, record["samples"], micro))
        if prof is not None:
            prof.step()
        if step % cfg.logging_steps == 0 or step == total_steps:
            writer.log(record)
        bar.set_postfix(loss=f"{loss:.3f}")
        bar.update()
        if cfg.eval_steps > 0 and (step % cfg.eval_steps == 0) and step != total_steps:
            eval_losses.append(run_eval(step))
        if cfg.save_steps > 0 and step % cfg.save_steps == 0:
            pos = {"epoch": stream.epoch, "consumed": stream.consumed}
            ckpt = checkpoint.save_checkpoint(
                writer.run_dir,
                step,
                model,
                optimizer,
                scheduler,
                pos,
                info.rank,
                keep=cfg.save_total_limit,
                config=cfg,
            )
            log.info("checkpoint %s", ckpt)
    bar.close()
    benchmark.stop_profiler(prof)
    if meter:
        meter.write(writer.run_dir, f"fsdp{cfg.fsdp_version}", evidence)
    stopped_early = last_step < total_steps
    if not stopped_early:
        eval_losses.append(run_eval(total_steps))
    train_time = time.perf_counter() - t_train

    final_dir, adapter = None, None
    if cfg.save_final_model and not stopped_early:
        final_dir = writer.run_dir / "final_model"
        if cfg.lora:
            from smolfsdp.sharding.lora import save_adapter

            adapter = save_adapter(model, final_dir, info, cfg, tokenizer)
        else:
            save_final_model(model, tokenizer, final_dir, info)
    opt_steps = [int(st["step"]) for st in optimizer.state.values() if "step" in st]
    # bytes this rank really holds after training (storage, not numel): parameter shards, Adam m and v
    held = {
        "param_bytes": storage_bytes(local_tensors(model)),
        "optimizer_bytes": storage_bytes(
            [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
        ),
    }
    memory = all_gather_object(held)
    return {
        "requested": {
            "engine": "native",
            "strategy": f"fsdp{cfg.fsdp_version}",
            "sharding_strategy": cfg.sharding_strategy,
            "lora": cfg.lora,
        },
        "effective": {
            "strategy": f"fsdp{cfg.fsdp_version}",
            "reason": "native engine: torch.distributed.fsdp shards on any backend, gloo included",
            "evidence": evidence,
        },
        "params": {
            "total": total_params,
            "trainable": trainable_params,
            "local_numel_per_rank": local,
            "fraction_per_rank": [round(n / total_params, 4) for n in local],
        },
        "memory_per_rank": memory,
        "data": data.stats(),
        "metrics": {
            "steps": last_step,
            "optimizer_step": max(opt_steps, default=0),
            "resumed_from": resumed_from,
            "stopped_early": stopped_early,
            "train_loss_first": train_losses[0] if train_losses else None,
            "train_loss_last": train_losses[-1] if train_losses else None,
            "eval_loss_first": eval_losses[0],
            "eval_loss_last": eval_losses[-1],
            "train_runtime_s": round(train_time, 2),
            "tokens": tokens_total,
            "tokens_per_s": round(tokens_total / train_time, 1),
        },
        "final_model": str(final_dir) if final_dir and not cfg.lora else None,
        "adapter": adapter,
    }
