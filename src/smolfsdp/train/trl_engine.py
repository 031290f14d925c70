"""The ``trl`` engine: TRL ``SFTTrainer`` with the seed run's FSDP settings (chapter "The full fine-tune").

``run_trl`` builds the tokenizer, data and model, turns the run config into ``SFTConfig`` with the
seed's ``fsdp_config`` (FSDP1, ``FULL_SHARD``, auto-wrap at ``SmolLM3DecoderLayer``,
``BACKWARD_PRE``, ``SHARDED_STATE_DICT``, offload switch; :func:`trl_args`), trains, and reports
what accelerate really built (:func:`detect_effective`: FSDP1, FSDP2 or DDP, with evidence). On CPU
runs ``smolfsdp.train.accelerate_cpu_fsdp`` lifts accelerate's accelerator-only FSDP gate, so the
Trainer shards on gloo too. Checkpoints and benchmark mode: ``smolfsdp.train.trl_trainer``.

    smolfsdp train --config configs/runs/smoke_trl.yaml                # FSDP1 on 2 CPU processes
    smolfsdp train --config configs/runs/smollm3_3b_medical.yaml       # the real run, 2 GPUs
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from trl import SFTConfig

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.config import TrainConfig
from smolfsdp.data.packing import sft_collation_args
from smolfsdp.data.prepare import prepare_data
from smolfsdp.estimate.adamw_step import built_adamw
from smolfsdp.measure import benchmark
from smolfsdp.measure.results import versions
from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.sharding import fsdp1, fsdp2
from smolfsdp.sharding.distributed import DistInfo, all_gather_object
from smolfsdp.train import accelerate_cpu_fsdp, steps
from smolfsdp.train.export import save_final_model
from smolfsdp.train.speedups import build_kwargs, run_options_record, trl_speedup_args
from smolfsdp.train.trl_callbacks import EvalAtEndCallback, RunWriterCallback, use_one_line_progress
from smolfsdp.train.trl_trainer import BenchmarkCallback, SmolSFTTrainer, StopAtStepCallback

log = logging.getLogger(__name__)


def detect_effective(trainer, *, cpu_gate_lifted: bool = False) -> dict[str, Any]:
    """What the Trainer actually did with the model: FSDP1, FSDP2, DDP or nothing, and why.

    Read from the wrapped model, never from the configuration: FSDP1 is reported only when
    ``FullyShardedDataParallel`` units exist (evidence: units, FlatParameters, sharding strategy,
    activation-checkpoint wrappers, mixed-precision dtypes), FSDP2 only when parameters are DTensors.
    ``cpu_gate_lifted`` says whether ``smolfsdp.train.accelerate_cpu_fsdp`` was installed (for the reason).
    """

    wrapped = trainer.model_wrapped
    acc = trainer.accelerator
    evidence = {
        "accelerate_distributed_type": str(acc.distributed_type),
        "trainer_is_fsdp_enabled": trainer.is_fsdp_enabled,
        "wrapper": type(wrapped).__name__,
        "accelerate_cpu_gate_lifted": cpu_gate_lifted,
    }
    modules = list(wrapped.modules())
    on_cpu = acc.device.type == "cpu"
    units = [m for m in modules if isinstance(m, FullyShardedDataParallel)]
    if units:
        mp = getattr(units[0], "mixed_precision", None)
        reason = "accelerate wrapped the model in FullyShardedDataParallel"
        if on_cpu and cpu_gate_lifted:
            reason = accelerate_cpu_fsdp.REASON
        return {
            "strategy": "fsdp1",
            "reason": reason,
            "evidence": {
                **evidence,
                "fsdp_units": len(units),
                "parameter_type": "FlatParameter",
                # with use_orig_params the module's parameters are views; each unit owns one FlatParameter
                "flat_parameters": sum(getattr(u, "_flat_param", None) is not None for u in units),
                "sharding_strategy": getattr(getattr(units[0], "sharding_strategy", None), "name", None),
                "activation_checkpoint_wrappers": sum(isinstance(m, CheckpointWrapper) for m in modules),
                "mixed_precision": None
                if mp is None or mp.param_dtype is None
                else {k: str(getattr(mp, k)).replace("torch.", "") for k in MP_FIELDS},
            },
        }
    if any(isinstance(m, FSDPModule) for m in modules) or any(
        isinstance(p, DTensor) for p in wrapped.parameters()
    ):
        n = sum(isinstance(m, FSDPModule) for m in modules)
        return {
            "strategy": "fsdp2",
            "reason": "accelerate applied fully_shard (DTensor parameters)",
            "evidence": {**evidence, "fsdp_units": n, "parameter_type": "DTensor"},
        }
    if isinstance(wrapped, DistributedDataParallel):
        if on_cpu and not cpu_gate_lifted:
            why = (
                "accelerate enables FSDP only on accelerators and accelerate_fsdp_on_cpu is false, so on CPU the "
                "Trainer wrapped the model in DistributedDataParallel: every rank held all parameters"
            )
        elif not trainer.is_fsdp_enabled:
            why = "the Trainer received no FSDP plugin (no fsdp_config), so accelerate wrapped it in DDP"
        else:
            why = "accelerate had an FSDP plugin but wrapped the model in DistributedDataParallel"
        return {"strategy": "ddp", "evidence": evidence, "reason": why}
    return {
        "strategy": "none",
        "reason": "single process: the Trainer applied no data-parallel wrapper",
        "evidence": evidence,
    }


MP_FIELDS = ("param_dtype", "reduce_dtype", "buffer_dtype")


def trainer_fsdp_config(cfg: TrainConfig, wrap_class: str, *, on_cpu: bool) -> dict[str, Any]:
    """The ``fsdp_config`` the Trainer receives for ``cfg`` (``fsdp1.hf_fsdp_config`` with the recipe's
    settings). ``sync_module_states`` is off on CPU: every rank builds the same seeded model, and torch's
    broadcast of module states needs an accelerator there (``smolfsdp.train.accelerate_cpu_fsdp``)."""
    return fsdp1.hf_fsdp_config(
        cfg.fsdp_version,
        wrap_class,
        sharding_strategy=cfg.sharding_strategy,
        backward_prefetch=cfg.backward_prefetch,
        state_dict_type=cfg.state_dict_type,
        cpu_offload=cfg.cpu_offload,
        activation_checkpointing=cfg.activation_checkpointing,
        sync_module_states=not on_cpu,
    )


def trl_args(cfg: TrainConfig, info: DistInfo, output_dir: str, wrap_class: str, *, has_eval: bool = True):
    """The ``SFTConfig`` for the TRL engine (the seed run's settings; CPU-safe overrides on CPU).

    Evaluation follows ``steps.is_eval_step`` as the native engine does: ``eval_on_start``, every
    ``eval_steps`` (the Trainer adds the last step itself), and with ``eval_steps`` 0 only the last step
    (:func:`build_callbacks` adds ``EvalAtEndCallback``); none without eval rows (``has_eval``) or in
    benchmark mode, which times training steps only.

    TRL 1.16's fused LM-head loss: ``SFTTrainer.__init__`` always patches the model with
    ``trl.trainer.utils.add_fused_lm_head`` (no ``SFTConfig`` switch), and its training forward
    calls ``model(..., fused_lm_head=True)``: the LM head projects in vocabulary chunks and returns
    per-token log-probabilities, never the ``(batch, seq, vocab)`` logits. On CUDA (or XPU) with
    Triton installed (``trl.kernels.chunked_logprob._use_triton``) it scores only the positions with
    a label, through Triton kernels; on CPU a chunked PyTorch path scores every position. Nothing
    here turns it off (``loss_type`` stays ``"nll"``, no label smoothing, no ``compute_loss_func``),
    so CPU runs exercise the chunked loss and a GPU run is the first to take the Triton kernels.
    """

    on_cpu = info.device.type == "cpu"
    evaluates = has_eval and not cfg.benchmark_steps
    multi = info.world_size > 1
    args = SFTConfig(
        output_dir=output_dir,
        seed=cfg.seed,
        data_seed=cfg.seed,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        per_device_eval_batch_size=cfg.per_device_eval_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_ratio,  # a float < 1 is a ratio in transformers 5.x
        lr_scheduler_type=cfg.lr_scheduler_type,
        max_grad_norm=cfg.max_grad_norm,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        logging_steps=cfg.logging_steps,
        eval_strategy="steps" if evaluates and cfg.eval_steps > 0 else "no",
        eval_steps=cfg.eval_steps if cfg.eval_steps > 0 else None,
        eval_on_start=evaluates and cfg.eval_on_start,
        save_strategy="steps" if cfg.save_steps > 0 else "no",
        save_steps=cfg.save_steps if cfg.save_steps > 0 else 500,
        report_to="none",
        # TRL defaults bf16=True and gradient_checkpointing=True; neither works or is wanted on CPU,
        # and transformers warns HF gradient checkpointing under FSDP adds an all-gather (FSDP's own is used).
        bf16=cfg.mixed_precision == "bf16" and not on_cpu,
        activation_checkpointing=False,
        use_cpu=on_cpu,
        ddp_backend=info.backend if multi else None,
        # Every parameter of the causal LM gets a gradient. The Trainer's default (True without gradient
        # checkpointing) makes DDP search the graph each step and warn that it found nothing unused.
        ddp_find_unused_parameters=False,
        fsdp=multi,
        fsdp_config=trainer_fsdp_config(cfg, wrap_class, on_cpu=on_cpu) if multi else None,
        dataset_kwargs={"skip_prepare_dataset": True},  # smolfsdp.data.prepare already tokenised with labels
        remove_unused_columns=False,
        **sft_collation_args(cfg),  # padded, padding-free or packed (data.packing): max_length, packing, ...
        disable_tqdm=not info.is_main,
        dataloader_drop_last=True,
        **trl_speedup_args(cfg),  # torch_compile, use_liger_kernel (smolfsdp.train.speedups)
    )
    if multi:
        keep_fp32_buffers_and_reduce(args, cfg)
        if cfg.gradient_accumulation_steps > 1 and not accumulates_under_no_sync(cfg):
            args.accelerator_config.gradient_accumulation_kwargs = {"sync_each_batch": True}
    # accelerate 1.15 would wrap with FULL_SHARD whatever fsdp_config asks (see the function)
    return fsdp1.pin_plugin_sharding_strategy(args)


def accumulates_under_no_sync(cfg: TrainConfig) -> bool:
    """Whether the TRL engine runs accumulation micro-batches under FSDP1 ``no_sync()``.

    By default the Trainer does (accelerate skips gradient sync until the last micro-batch), and each
    rank then holds the whole unsharded gradient in the compute dtype (5.7 GiB per GPU for SmolLM3-3B
    in bf16). smolfsdp asks for ``sync_each_batch`` instead (a reduce-scatter per micro-batch: more
    communication, sharded memory), except with FSDP1 CPU offload, which supports accumulation only
    inside ``no_sync()`` (outside it the gradients come out wrong). The memory estimate takes the same
    answer (``smolfsdp.estimate.memory.estimate_memory(no_sync=...)``), so estimate and run agree.
    """
    return (
        cfg.engine == "trl"
        and cfg.fsdp_version == 1
        and cfg.gradient_accumulation_steps > 1
        and cfg.cpu_offload
    )


def keep_fp32_buffers_and_reduce(args, cfg: TrainConfig) -> None:
    """Give the Trainer's FSDP bf16 compute with fp32 gradient reduction and fp32 buffers.

    Why: with ``bf16=True`` accelerate 1.15 builds ``MixedPrecision(param_dtype=bf16,
    reduce_dtype=bf16, buffer_dtype=bf16)`` (``FullyShardedDataParallelPlugin.set_mixed_precision``).
    bf16 buffers include SmolLM3's rotary ``inv_freq``: trained positions then differ from the fp32
    ones the model is served with (the phase error grows with position); bf16 reduction drops the low
    bits of the sum over ranks. A policy set in the plugin's arguments is kept by accelerate
    (``set_mixed_precision`` only fills an empty one). No-op without ``mixed_precision: bf16``.
    """
    if cfg.mixed_precision != "bf16" or not args.fsdp_plugin_args:
        return
    # the native engine's policies: one definition of "bf16" for both engines
    args.fsdp_plugin_args["mixed_precision_policy"] = (
        fsdp1.mixed_precision_policy(torch.bfloat16)
        if cfg.fsdp_version == 1
        else fsdp2.default_mp_policy("bf16")
    )


def lift_gate_if_asked(cfg: TrainConfig, info: DistInfo) -> bool:
    """Install ``smolfsdp.train.accelerate_cpu_fsdp`` on multi-process CPU runs when the config asks
    (``accelerate_fsdp_on_cpu``, default true); returns whether it is installed."""

    if info.device.type == "cpu" and info.world_size > 1 and cfg.accelerate_fsdp_on_cpu:
        accelerate_cpu_fsdp.lift_cpu_fsdp_gate()
    else:
        accelerate_cpu_fsdp.restore_cpu_fsdp_gate()
    return accelerate_cpu_fsdp.is_lifted()


def _local_numel(wrapped) -> int:
    """Parameter elements this rank holds: FlatParameter shards (FSDP1), DTensor shards (FSDP2), or
    every parameter (DDP and no wrapper)."""

    if any(isinstance(m, FullyShardedDataParallel) for m in wrapped.modules()):
        return fsdp1.local_numel(wrapped)
    return fsdp2.local_numel(wrapped)  # plain tensors count in full; tied ones once


def export_final_model(trainer, tokenizer, final_dir: Path, info: DistInfo) -> Path:
    """The final model through the native engine's export, the same for both engines: the full state dict
    gathered with torch.distributed.checkpoint (offloaded to the host only on CUDA; accelerate's FSDP1
    gather always offloads, which crashes a CPU rank), the tied lm_head saved once, safetensors only
    (no pickled TrainingArguments). Returns ``final_dir``."""
    unwrapped = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    unwrapped.config.use_cache = True  # the Trainer turns the KV cache off for training
    save_final_model(trainer.model_wrapped, tokenizer, final_dir, info)
    return final_dir


def _run_metrics(trainer, out, callback) -> dict[str, Any]:
    """Headline losses, runtime and this launch's tokens (as the native engine counts: a resumed run's
    earlier tokens are not in its runtime)."""
    evals = [(r["step"], r["eval_loss"]) for r in callback.records if r.get("split") == "eval"]
    trains = [r["loss"] for r in callback.records if r.get("split") == "train"]
    runtime = out.metrics.get("train_runtime", 0.0)
    tokens = int(trainer.state.num_input_tokens_seen) - callback.tokens_at_start
    return {
        "train_loss_first": trains[0] if trains else None,
        "train_loss_last": trains[-1] if trains else None,
        **steps.eval_metrics(evals),
        "train_runtime_s": round(runtime, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / max(runtime, 1e-9), 1),
    }


FSDP1_NOTE = (
    "note: transformers deprecates the Trainer's FSDP1 path (FSDP2, fsdp_version 2, is its default); "
    "the pinned transformers %s still runs it"
)


def build_callbacks(cfg: TrainConfig, info: DistInfo, writer, model, n_params: int, prof, has_eval=True):
    """``(writer callback, benchmark callback or None, all callbacks)`` for the run's Trainer.

    The writer callback turns the Trainer's logs into ``metrics.jsonl`` records; the benchmark one
    (benchmark mode or ``profile``) meters each step and steps ``prof``; ``stop_at_step`` ends the
    run early; with ``eval_steps`` 0 an evaluation after the last step (:func:`trl_args`). ``n_params``: the
    model's parameters, all trainable in the TRL engine.
    """
    samples_per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * info.world_size
    callback = RunWriterCallback(writer, samples_per_step)
    callbacks: list = [callback]
    bench_cb = None
    if cfg.benchmark_steps or prof is not None:
        bench_cb = BenchmarkCallback(cfg, info, model, n_params, n_params, prof=prof)
        callback.bench = bench_cb
        callbacks.append(bench_cb)
    if cfg.stop_at_step:
        callbacks.append(StopAtStepCallback(cfg.stop_at_step))
    if cfg.eval_steps == 0 and has_eval and not cfg.benchmark_steps:
        callbacks.append(EvalAtEndCallback())
    return callback, bench_cb, callbacks


def run_trl(cfg: TrainConfig, info: DistInfo, writer) -> dict[str, Any]:
    """Train ``cfg`` with the TRL ``SFTTrainer`` on the current process group; return summary fields
    (requested vs effective strategy with evidence, parameters held per rank, data, metrics)."""

    gate_lifted = lift_gate_if_asked(cfg, info)
    if cfg.fsdp_version == 1 and info.world_size > 1:  # transformers' own line is filtered (smolfsdp.quiet)
        log.info(FSDP1_NOTE, versions().get("transformers"))
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
    data = prepare_data(cfg, tokenizer)
    log.info("building model %s, then TRL's SFTTrainer (which shards it when training starts)", cfg.model)
    model = build_model(cfg.model, tokenizer, **build_kwargs(cfg))  # attn_implementation included
    wrap_cls = resolve_wrap_class(model, cfg.wrap_class)
    total_params = sum(p.numel() for p in model.parameters())
    has_eval = data.eval is not None
    args = trl_args(cfg, info, str(writer.run_dir / "trainer"), wrap_cls.__name__, has_eval=has_eval)
    prof = benchmark.start_profiler(cfg, info, writer.run_dir)
    if prof is not None:
        log.info(
            benchmark.PROFILING_LINE, cfg.profile_wait, cfg.profile_warmup, cfg.profile_active, writer.run_dir
        )
    callback, bench_cb, callbacks = build_callbacks(cfg, info, writer, model, total_params, prof, has_eval)
    trainer = SmolSFTTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=tokenizer,
        callbacks=callbacks,
        smol_cfg=cfg,
        run_dir=writer.run_dir,
    )
    use_one_line_progress(trainer)  # one readable line per logging step on rank 0, not the raw dict
    if bench_cb is not None:
        bench_cb.trainer = trainer
    resumed_from = None
    if cfg.resume_from:
        resumed_from = str(checkpoint.resolve_resume(cfg.resume_from, writer.run_dir))
        log.info("resuming from %s", resumed_from)
    out = trainer.train(resume_from_checkpoint=resumed_from)
    benchmark.stop_profiler(prof)
    effective = detect_effective(trainer, cpu_gate_lifted=gate_lifted)
    local = all_gather_object(_local_numel(trainer.model_wrapped))
    trainer_dir = writer.run_dir / "trainer"
    if info.is_main and trainer_dir.is_dir() and not any(trainer_dir.iterdir()):
        trainer_dir.rmdir()  # nothing is written there: checkpoints go to checkpoints/, logs to metrics.jsonl
    if cfg.benchmark_steps:
        bench_cb.meter.write(writer.run_dir, effective["strategy"], effective["evidence"])
    total_steps = trainer.state.max_steps
    stopped_early = out.global_step < total_steps
    final_dir = None
    if cfg.save_final_model and not stopped_early:
        final_dir = export_final_model(trainer, tokenizer, writer.run_dir / "final_model", info)
    requested = {
        "engine": "trl",
        "strategy": f"fsdp{cfg.fsdp_version}" if info.world_size > 1 else "none",
        "sharding_strategy": cfg.sharding_strategy,
        "fsdp_config": args.fsdp_config,
    }
    return {
        "requested": requested,
        "effective": effective,
        "params": {
            "total": total_params,
            "trainable": total_params,
            "local_numel_per_rank": local,
            "fraction_per_rank": [round(n / total_params, 4) for n in local],
        },
        "optimizer": {"optim": args.optim.value, "adamw": built_adamw(trainer.optimizer)},
        "data": {**data.stats(), **trainer.token_fields()},  # a collective: every rank
        "run_options": run_options_record(cfg, model, wrapped=trainer.model_wrapped),
        "metrics": {
            "steps": out.global_step,
            "resumed_from": resumed_from,
            "stopped_early": stopped_early,
            **_run_metrics(trainer, out, callback),
        },
        "final_model": str(final_dir) if final_dir else None,
    }
