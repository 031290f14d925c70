"""The dry run of a run config: its real model at full size, sharded by the package's own code, on fake tensors.

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``) shows it for the book's SmolLM3-3B recipes; ``smolfsdp dryrun`` prints it.
What runs, on rank 0 of a fake world of ``world_size`` ranks (every rank runs the same code on the same
shapes; rank 0 is the fullest, FSDP padding lands on the last ranks):

* the model built from its config (``smolfsdp.estimate.params.resolve_model_config``: the bundled SmolLM3-3B
  config for its hub id, any folder with ``config.json``, ``tiny``) under ``FakeTensorMode``, fp32 as the
  engines build it; LoRA adapters by ``sharding.lora.apply_lora``;
* ``train.native.shard_model`` (FSDP1 wrap or FSDP2 ``fully_shard``, activation checkpointing, mixed
  precision, offload, HSDP mesh) and ``train.native.make_optimizer`` building the AdamW step the engine runs on
  a GPU (``estimate.adamw_step.engine_optimizer``: ``foreach`` for native, ``fused`` for TRL, whose Trainer
  builds ``adamw_torch_fused``); for a TRL-engine config the native FSDP1 wrap with the arguments the package
  hands accelerate (:data:`TRAINER_FSDP1_ARGS`: accelerate 1.15 refuses to build its plugin in a fake world);
* for a TRL-engine config, TRL's fused LM head (``add_fused_lm_head``, as ``SFTTrainer`` patches the model;
  its tiles allocate as its Triton kernels do on a GPU: ``gpu_path.trl_triton_tiles``), called with
  ``fused_lm_head=True`` as ``SFTTrainer.compute_loss`` calls it;
* ``steps`` of the native step: ``gradient_accumulation_steps`` micro-batches of
  ``per_device_train_batch_size x max_length`` tokens (every row full length: the padded worst case),
  ``train.steps.micro_batch_backward``, ``clip_grad_norm_tensor``, ``optimizer.step``, ``zero_grad``.

AdamW's state is created first (:func:`_init_optimizer_state`), so the traced step is a steady one. Raises ConfigError
for a model without a config, and what ``shard_model`` raises.

    smolfsdp dryrun --config configs/runs/lora_smollm3_3b.yaml --gpus 4 --json
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from smolfsdp.audit.dryrun.gpu_path import trl_triton_tiles, unpacked_positions
from smolfsdp.audit.dryrun.streams import allocator_trace, record_stream_bytes
from smolfsdp.audit.dryrun.tracker import (
    FSDP2Tracker,
    ModuleTracker,
    cuda_dropout,
    fake_data_pointer_quiet,
    fsdp1_reshard_by_storage,
    mark_modules,
    untracked_sharding_propagation,
)
from smolfsdp.config import TrainConfig
from smolfsdp.data.packing import flatten_full_rows
from smolfsdp.estimate.adamw_step import ADAMW_IMPLS, OPTIMIZER_TEXT, engine_optimizer
from smolfsdp.estimate.flops import flops_per_token
from smolfsdp.estimate.loss_path import engine_loss_path
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.estimate.recipes import check_choice
from smolfsdp.measure.benchmark import matmul_params, model_geometry
from smolfsdp.models.modeling import decoder_layers, resolve_wrap_class
from smolfsdp.paths import shown_path
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.sharding.fsdp1 import fsdp_units as fsdp1_units
from smolfsdp.sharding.lora import apply_lora
from smolfsdp.sharding.shards import local_tensors, storage_bytes
from smolfsdp.train import native, steps
from smolfsdp.train.batches import count_label_tokens

log = logging.getLogger(__name__)

#: How every dry-run number is labelled, wherever it appears.
LABEL = (
    "traced on fake tensors: what PyTorch allocates for the real model and code, not a GPU measurement. "
    "On a GPU these can differ: the attention kernel (a CPU dry run takes the CPU SDPA kernel; flash or "
    "memory-efficient attention on CUDA keeps other tensors for backward), the caching allocator's "
    "reserved-but-free blocks and fragmentation, the CUDA context and NCCL's buffers (not tensors, so not "
    "counted here), and recordStream delays in FSDP1's frees."
)
#: What accelerate 1.15 wraps a TRL-engine FSDP1 model with, from the ``fsdp_config`` the package passes
#: (``smolfsdp.sharding.fsdp1.hf_fsdp_config``; accelerate's ``FullyShardedDataParallelPlugin`` and
#: ``Accelerator.prepare_model``): transformer auto-wrap, the strategy, backward prefetch, bf16 compute with
#: fp32 reduction and buffers (``trl_engine``), ``use_orig_params``; activation checkpointing after wrapping.
TRAINER_FSDP1_ARGS = "FullyShardedDataParallel(auto_wrap=transformer, sharding_strategy, backward_prefetch, mixed_precision, use_orig_params=True) + apply_activation_checkpointing"


@dataclasses.dataclass
class DryRun:
    """One dry run's report for rank 0 (bytes, counts, FLOPs per optimizer step)."""

    setup: dict[str, Any]
    peak_bytes: int
    peak_by_category: dict[str, int]
    peak_moment: dict[str, str]
    held_bytes: dict[str, int]  # after the step: parameter shards, optimizer state (storage bytes)
    collectives: list[dict[str, Any]]  # per step: phase, kind, count, bytes
    flops_counted: float  # recomputation under activation checkpointing included
    flops_by_phase: dict[str, int]
    flops_formula: float
    tokens: int
    series: list[dict[str, Any]]
    seconds: float
    label: str = LABEL
    # with CPU offload: what the host holds after the step (parameter shards, gradients, optimizer state) and
    # the device's own peak without it, with its moment (None without offload: everything is on the device)
    offload: dict[str, Any] | None = None
    # the allocation order (``smolfsdp.audit.allocator_replay.replay``); not written with the report (large)
    alloc_events: list = dataclasses.field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("alloc_events")
        return out


@contextmanager
def fake_world(world_size: int, rank: int = 0, fake: bool = True):
    """A ``fake`` process group of ``world_size`` ranks (this process is ``rank``) and a ``FakeTensorMode``.

    Collectives return at once with tensors of the right shapes; no memory is allocated for tensors made
    inside. ``fake=False`` keeps real tensors (the same code really allocating: how the tests check that
    fake tensors change nothing, on a model small enough to allocate). Destroys the group on exit. Raises
    RuntimeError when a process group already exists.
    """
    if dist.is_initialized():
        raise RuntimeError(
            "a process group already exists in this process; run the dry run in its own process"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext() as mode:
            yield mode
    finally:
        dist.destroy_process_group()


def build_meta_model(cfg: TrainConfig):
    """The run's model from its config on the ``meta`` device, fp32, LoRA adapters added, in train mode.

    Why meta first: peft moves each new adapter to its base layer's device with ``Module.to``, and a
    module's parameters that are fake tensors are always swapped (``torch.utils.swap_tensors``), which fails
    on them; on meta the move is a plain one. :func:`materialize` then makes every tensor fake.
    """
    from transformers import AutoModelForCausalLM  # deferred: transformers takes seconds to import

    config = resolve_model_config(cfg.model, trust_remote_code=cfg.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    return apply_lora(model, cfg) if cfg.lora else model


def materialize(model):
    """Meta tensors to fake ``cpu`` tensors (inside :func:`fake_world`), tied embeddings tied again."""
    model.to_empty(device="cpu")  # new Parameter objects, requires_grad kept; ties are broken
    model.tie_weights()
    return model


def micro_batches(cfg: TrainConfig, vocab_size: int) -> list[dict[str, torch.Tensor]]:
    """``gradient_accumulation_steps`` full-length micro-batches of random token ids (real tensors: small)."""
    shape = (cfg.per_device_train_batch_size, cfg.max_length)
    ids = torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(cfg.seed))
    # No attention_mask: rows are full length, and for a mask of ones transformers' SDPA path passes no mask
    # (is_causal) on real tensors; under fake tensors it cannot see the ones and would build a 4-D mask,
    # which the CPU attention kernel copies to fp32 for every layer (1.1 GiB saved for SmolLM3-3B at 2 x 2048).
    rows = [{"input_ids": ids, "labels": ids.clone()} for _ in range(cfg.gradient_accumulation_steps)]
    return [flatten_full_rows(b) for b in rows] if cfg.packing else rows  # packed: one row, positions per row


@contextmanager
def _patched(cfg: TrainConfig, world: int, fake: bool):
    """The fake world and every change the dry run makes to torch's and transformers' behaviour while it runs
    (each context manager says why where it is defined)."""
    with (
        fake_world(world, fake=fake),
        untracked_sharding_propagation(),
        cuda_dropout(),
        fsdp1_reshard_by_storage(),
        fake_data_pointer_quiet(),
        unpacked_positions(),  # the attention path real tensors take (gpu_path.py says why)
        trl_triton_tiles() if cfg.engine == "trl" else nullcontext(),  # TRL's fused LM head as on a GPU
    ):
        yield


def dry_run(
    cfg: TrainConfig, world_size: int | None = None, progress=None, fake: bool = True, loop=None, adamw=None
) -> DryRun:
    """One optimizer step of ``cfg`` at full size on fake tensors (with AdamW's state already created).

    ``world_size`` defaults to ``cfg.nproc``. ``progress(str)`` is called at each stage (the CLI prints it).
    ``adamw``: the AdamW step (:func:`build_optimizer`; a committed grid row is traced again with its own).
    ``loop``: another project's micro-batch forward and backward (``published_replay.TorchtitanLoop``), called
    as ``loop(model, batch)`` in place of ``train.steps.micro_batch_backward``; its ``loss_path`` goes in ``setup``.
    """
    world = int(world_size or cfg.nproc)
    say = progress or (lambda msg: log.info(msg))
    t0 = time.perf_counter()
    info = DistInfo(rank=0, world_size=world, local_rank=0, device=torch.device("cpu"), backend="fake")
    say(f"building {shown_path(cfg.model)} from its config (meta device, then fake tensors)")
    model = build_meta_model(cfg)
    batches = micro_batches(cfg, model.config.vocab_size)  # real: the step reads their label count
    n_items = sum(count_label_tokens(b) for b in batches) * world  # every rank the same shapes
    with _patched(cfg, world, fake):
        model = materialize(model)
        if cfg.engine == "trl":  # SFTTrainer.__init__ patches the model so before accelerate wraps it
            add_trl_fused_lm_head(model)
        total = matmul_params(model)
        trainable = matmul_params(model, trainable_only=True)
        wrap_cls = resolve_wrap_class(model, cfg.wrap_class)
        layers = {f"layer {i}": m for i, m in enumerate(decoder_layers(model, wrap_cls))}
        say(f"sharding over a fake world of {world} (FSDP{cfg.fsdp_version}, {cfg.sharding_strategy})")
        model, evidence = native.shard_model(model, cfg, info)
        optimizer, adamw = build_optimizer(model, cfg, adamw, say)
        tracker_cls = FSDP2Tracker if cfg.fsdp_version == 2 else ModuleTracker
        say(
            f"one step: {len(batches)} micro-batch(es) of {tuple(batches[0]['input_ids'].shape)} tokens, tracked"
        )
        tracker = tracker_cls(model, optimizer)
        if cfg.cpu_offload:
            tracker.offload()
        handles = mark_modules(tracker, layers)
        with tracker, allocator_trace(tracker):
            _one_step(tracker, model, optimizer, batches, cfg, info, n_items, say=_timed(say, t0), loop=loop)
            # the step's allocation order; frees after this are the dry run's teardown, not the step's
            alloc_events = list(tracker.alloc_events)
        for h in handles:
            h.remove()
        held = tracker.held
        setup = {
            **_setup(cfg, world, evidence, total, trainable, tracker_cls, loop),
            "optimizer": OPTIMIZER_TEXT[adamw],
        }
        if cfg.fsdp_version == 1:  # on a GPU, active beyond the traced bytes (dryrun.streams)
            setup["fsdp1_record_stream_bytes"] = record_stream_bytes(model)
    tokens = cfg.per_device_train_batch_size * cfg.max_length * cfg.gradient_accumulation_steps
    geo = model_geometry(model)
    formula = tokens * flops_per_token(total, seq_len=cfg.max_length, trainable_params=trainable, **geo)
    peak = tracker.get_tracker_snapshot("peak")
    return DryRun(
        setup=setup,
        peak_bytes=sum(d.get("Total", 0) for d in peak.values()),
        peak_by_category={str(k.value): v for d in peak.values() for k, v in d.items() if k != "Total" and v},
        peak_moment=tracker.peak_moment,
        held_bytes=held,
        collectives=[
            {"phase": p, "kind": k, "count": c, "bytes": b} for (p, k), (c, b) in tracker.collectives.items()
        ],
        flops_counted=float(sum(tracker.flops.values())),
        flops_by_phase=dict(tracker.flops),
        flops_formula=formula,
        tokens=tokens,
        series=tracker.series,
        seconds=round(time.perf_counter() - t0, 1),
        offload={
            "host_bytes": sum(held.values()),
            "device_peak_bytes": tracker.device_peak,
            "device_peak_moment": tracker.device_peak_moment,
        }
        if cfg.cpu_offload
        else None,  # fmt: skip
        alloc_events=alloc_events,
    )


def build_optimizer(model, cfg: TrainConfig, adamw: str | None = None, say=lambda m: None):
    """(AdamW over ``model``'s trainable parameters with its state created, the implementation's name):
    ``train.native.make_optimizer`` with the flag of ``adamw`` (``estimate.adamw_step.ADAMW_IMPLS``; by default
    what ``cfg``'s engine builds on a GPU, ``engine_optimizer``). ConfigError for an unknown ``adamw``."""
    adamw = check_choice(adamw or engine_optimizer(cfg.engine), tuple(ADAMW_IMPLS), "adamw")
    optimizer = native.make_optimizer(model, cfg, foreach=adamw == "foreach", fused=adamw == "fused" or None)
    say(f"creating the {adamw} AdamW's state (one step on zero gradients: torch creates m and v lazily)")
    _init_optimizer_state(model, optimizer)
    return optimizer, adamw


def _init_optimizer_state(model, optimizer) -> None:
    """Create AdamW's state before the tracked step, as any step after the first finds it.

    Why not a whole warm-up step: it costs a full forward and backward, and under ``FakeTensorMode`` the
    first ``step()`` of a foreach AdamW records transient tensors several times the shard size that a real
    first step does not allocate (checked against a real CPU run of the same code: 3.2 vs 9.6 GiB traced).
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _timed(say, t0: float):
    """``say`` with the seconds since ``t0`` in front (the step's stages take tens of seconds each)."""
    return lambda msg: say(f"{time.perf_counter() - t0:5.0f} s  {msg}")


def _one_step(
    tracker,
    model,
    optimizer,
    batches,
    cfg: TrainConfig,
    info: DistInfo,
    n_items: int,
    say=lambda m: None,
    loop=None,
) -> None:
    """The native step (``NativeTrainer.train_step``) without reading a number back to the host;
    ``say(str)`` at each stage (forward, backward per micro-batch, the optimizer step)."""
    for i, batch in enumerate(batches):
        if i:  # the trackers keep per-module statistics of one forward; the peak is kept across calls
            tracker.reset_mod_stats()
        tracker.phase = "forward"
        tracker.mark("start")
        say(f"micro-batch {i + 1}/{len(batches)}: forward")
        steps_micro(
            tracker,
            model,
            batch,
            info,
            n_items,
            say=lambda m, i=i: say(f"micro-batch {i + 1}/{len(batches)}: {m}"),
            loop=loop,
            **({"fused_lm_head": True} if cfg.engine == "trl" else {}),
        )
    say("gradient clipping and the AdamW step")
    tracker.phase = "clip"
    steps.clip_grad_norm_tensor(model, cfg.max_grad_norm, cfg.fsdp_version)
    tracker.phase = "optimizer"
    optimizer.step()
    # bytes held after the step, before zero_grad frees the gradients: the static terms of the estimate
    tracker.held = {**native.held_bytes(model, optimizer), "grad_bytes": grad_bytes(model)}
    optimizer.zero_grad(set_to_none=True)
    tracker.mark("end")


def steps_micro(
    tracker, model, batch, info: DistInfo, n_items: int, say=lambda m: None, loop=None, **forward_kwargs
) -> None:
    """``train.steps.micro_batch_backward`` with the tracker's phase set to backward when forward ends
    (``forward_kwargs``: ``fused_lm_head=True`` for a TRL-engine recipe, as ``SFTTrainer.compute_loss`` calls it)."""

    def to_backward(*_):
        tracker.phase = "backward"
        say("backward")

    handle = model.register_forward_hook(to_backward)
    try:
        if loop is not None:
            loop(model, batch)
        else:
            steps.micro_batch_backward(model, batch, info.world_size, info.device, n_items, **forward_kwargs)
    finally:
        handle.remove()


def add_trl_fused_lm_head(model) -> None:
    """Patch ``model`` with TRL's fused LM head as ``SFTTrainer.__init__`` does (TRL 1.16: the same outputs,
    ``train.trl_engine.trl_args`` says why the TRL engine always takes it)."""
    from trl.trainer.utils import add_fused_lm_head  # deferred: TRL takes seconds to import

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # before PEFT, as TRL does
    add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))


def grad_bytes(model) -> int:
    """Storage bytes of this rank's gradients: FSDP1's FlatParameter gradients, else each parameter's
    (FSDP2: the local shard of its ``DTensor`` gradient)."""
    return storage_bytes(
        [t.grad for t in local_tensors(model) if t.grad is not None]
        if fsdp1_units(model)
        else [p.grad for p in model.parameters() if p.grad is not None]
    )


def _setup(
    cfg: TrainConfig, world: int, evidence: dict, total: int, trainable: int, tracker_cls, loop=None
) -> dict[str, Any]:
    keys = (
        "model engine fsdp_version sharding_strategy mixed_precision activation_checkpointing ac_mode ac_every "
        "cpu_offload lora max_length per_device_train_batch_size gradient_accumulation_steps"
    ).split()
    out = {k: getattr(cfg, k) for k in keys}
    out.update(
        world_size=world,
        parameters=total,
        trainable=trainable,
        tracker=tracker_cls.__mro__[2].__name__,
        wrap=evidence,
        loss_path=engine_loss_path(cfg.engine),  # smolfsdp.estimate.loss_path: the code computing the loss
    )
    if cfg.lora and cfg.fsdp_version == 1:  # where the adapters sit (smolfsdp.lora_options)
        out["lora_layout"] = cfg.lora_layout
    if cfg.packing:  # one flattened row per micro-batch on SDPA's masked path (smolfsdp.estimate.packed)
        out["packing"] = True
    if cfg.engine == "trl":
        out["trainer_path"] = "modelled: " + TRAINER_FSDP1_ARGS
    if loop is not None:  # another project's loop stepped the model: its loss
        out.update(loss_path=loop.loss_path, loop=type(loop).__name__)
    return out
