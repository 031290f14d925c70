"""The memory estimate: per-rank bytes of FSDP fine-tuning, component by component.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``). A pure function of a model config
(built on the meta device, no weights) that puts together the pieces of its neighbours: exact
parameter counts (``smolfsdp.estimate.params``), how FSDP1 (``FlatParameter`` per unit) or FSDP2
(``DTensor`` ``Shard(0)`` per parameter) lays them out and pads them on each rank
(``smolfsdp.estimate.layout``), what a precision recipe keeps per parameter
(``smolfsdp.estimate.recipes``) and what autograd saves (``smolfsdp.estimate.activations``).
``smolfsdp.measure.memory_measure`` counts the same bytes on real ranks; the tests hold the two to 1%.

    smolfsdp memory --model smollm3-3b --gpus 2 --strategy FULL_SHARD --recipe hf-fsdp-bf16 --seq-len 4096
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from smolfsdp import lora_options
from smolfsdp.ac_options import check_ac_options
from smolfsdp.errors import ConfigError
from smolfsdp.estimate.activations import activation_breakdown
from smolfsdp.estimate.adamw_step import ADAMW_IMPLS
from smolfsdp.estimate.layout import sharded_state
from smolfsdp.estimate.loss_path import LEGACY_HF_LOSS, LOSS_PATHS, logits_component_bytes, with_loss_path  # noqa: F401
from smolfsdp.estimate.moments import peak_moments
from smolfsdp.estimate.packed import with_packed_attention
from smolfsdp.estimate.params import LoraSpec, count_parameters, model_units, resolve_model_config
from smolfsdp.estimate.recipes import GIB, RECIPES, STRATEGIES, Recipe, check_choice
from smolfsdp.estimate.record_stream import fsdp1_stream_held
from smolfsdp.estimate.reserved import reserved_parts
from smolfsdp.estimate.selective_ac_bytes import checkpointed_bytes

#: CUDA context + kernel images per process. Not visible to ``torch.cuda.memory_allocated``; with lazy
#: module loading (the default since CUDA 11.7) it is typically 0.3-1 GiB depending on GPU, driver and
#: libraries (PyTorch "CUDA semantics" notes; nvidia-smi on an idle process). A stated assumption.
CUDA_CONTEXT_BYTES = 512 * 2**20
#: NCCL communicator buffers per rank when world size > 1: NCCL_BUFFSIZE defaults to 4 MiB per
#: channel and peer (NCCL environment-variable docs); rings/trees with several channels put a
#: communicator in the hundreds of MiB. A stated assumption, not measured here.
COMM_BUFFER_BYTES = 256 * 2**20

#: How the model is loaded, for the load-time peaks:
#: ``every-rank`` (the default, what both smolfsdp engines do: ``modeling.build_model`` / ``from_pretrained`` in
#: every process, then wrap): the host of a node holds one full model per process, ``min(world_size,
#: gpus_per_node)`` of them at once. ``rank0``: only local rank 0 loads, the others build on meta
#: (``cpu_ram_efficient_loading`` with ``sync_module_states``, a Trainer option smolfsdp does not turn on): one
#: full model per node. ``meta``: build on meta, load each shard where it lives: nothing full on the host.
LOADINGS = ("every-rank", "rank0", "meta")
#: Where FSDP1 puts LoRA adapters: ``in-unit`` (smolfsdp's own wrap: adapters share their decoder layer's
#: FlatParameter, so the frozen base of that unit gets a gradient too) or ``adapter-units`` (each adapter
#: its own FSDP unit, as AnswerDotAI/fsdp_qlora ``train.py`` and llama-recipes wrap them: no base gradient).
#: ``adapter-units`` drops the base gradient, its reduce-scatter buffer and the base's saved tensors.
LORA_LAYOUTS = lora_options.LORA_LAYOUTS  # one list of names with the run config (``lora_layout``)


# ------------------------------------------------------------------------------------ estimate
@dataclass
class MemoryEstimate:
    """Bytes on one rank (device unless named ``host``), component by component."""

    model: str
    world_size: int
    strategy: str
    recipe: str
    fsdp_version: int
    seq_len: int
    micro_batch: int
    lora: bool
    offload: bool
    activation_checkpointing: bool
    rank: int
    shard_group: int
    params_bytes: int  # parameter shards (frozen base included)
    grads_bytes: int  # gradient shards
    master_bytes: int  # fp32 master copy (recipes that keep one)
    optimizer_bytes: int  # Adam m + v
    gathered_bytes: int  # full units held at once: root + current + prefetched layer (compute dtype)
    grad_buffer_bytes: int  # one unit's unsharded gradient + its reduce-scatter input
    activations_bytes: int  # saved for backward (checkpointed or not, as asked)
    activations_no_ac_bytes: int
    activations_ac_bytes: int
    logits_bytes: int  # logits held by the output + their fp32 upcast in the loss
    cuda_context_bytes: int
    comm_buffer_bytes: int
    host_bytes: int  # offloaded shards + state on the host, per rank
    n_step_tensors: int  # AdamW ``step`` scalars (4 host bytes each, not in any total)
    load_peak_device_bytes: int
    load_peak_host_bytes_per_node: int
    notes: list[str] = field(default_factory=list)
    # FSDP1 gradient accumulation under no_sync(): every rank holds the whole unsharded gradient of the
    # trainable parameters (compute dtype) between micro-batches (0 when each micro-batch reduce-scatters)
    no_sync_grads_bytes: int = 0
    # tensor bytes alive at each moment of a step (``smolfsdp.estimate.moments.peak_moments``: loss, layer,
    # last layer, optimizer); the device peak is the largest, held to the full-size dry run
    moments: dict[str, int] = field(default_factory=dict)
    lora_layout: str = "in-unit"  # one of LORA_LAYOUTS (FSDP1 with LoRA only)
    # fp32 [tokens, vocab] gradients at the loss moment (3 under LEGACY_HF_LOSS); the code computing the loss
    loss_fp32_copies: int = 2
    loss_path: str = "transformers"
    # FSDP1 sharded strategies: the blocks record_stream keeps active past their frees (one layer's unsharded
    # gradient, one gathered layer; ``smolfsdp.estimate.record_stream``): in reserved, not in allocated
    record_stream_bytes: int = 0
    # activation checkpointing's policy (``smolfsdp.ac_options``): ``full``, every ``ac_every``-th ``layer``, ``op``
    ac_mode: str = "full"
    ac_every: int | None = None
    # the AdamW step (``adamw_step.ADAMW_IMPLS``): what it adds to the optimizer moment
    adamw: str = "foreach"

    @property
    def base_grads(self) -> bool:
        """True when FSDP1 + LoRA gives the frozen base a gradient (adapters inside the layer's unit)."""
        return self.fsdp_version == 1 and self.lora_layout == "in-unit"

    @property
    def active_bytes(self) -> int:
        """Peak active bytes (``active_bytes.all.peak``): the tensor peak + FSDP1's ``record_stream_bytes``."""
        return self.moments[self.peak_moment] + self.record_stream_bytes

    @property
    def reserved_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` would read: the caching allocator's pools per stream, sized
        from this estimate (``smolfsdp.estimate.reserved.reserved_parts``, each constant with its source)."""
        return reserved_parts(self)["reserved"]

    @property
    def device_need_bytes(self) -> int:
        """What the GPU must hold: ``reserved_bytes`` + CUDA context + NCCL buffers (outside the allocator).
        What the fit verdict (``hardware.verdict``) compares with a GPU's memory."""
        return self.reserved_bytes + self.cuda_context_bytes + self.comm_buffer_bytes

    @property
    def static_bytes(self) -> int:
        """Parameter, gradient, master and optimizer bytes on the device (0 when offloaded)."""
        return self.params_bytes + self.grads_bytes + self.master_bytes + self.optimizer_bytes

    @property
    def components_sum_bytes(self) -> int:
        """The sum of the device components (what the stacked bars draw). Not a bound on the peak: a moment
        can hold tensors no component counts (a foreach AdamW's v-sized temporary in the optimizer step, the
        loss's fp32 ``tokens x vocabulary`` tensors as backward starts), so ``peak_bytes`` can exceed it
        (NO_SHARD on 2 GPUs at 4,096 tokens; FULL_SHARD on 2 with offload)."""
        return (
            self.static_bytes + self.gathered_bytes + self.grad_buffer_bytes + self.no_sync_grads_bytes
            + self.activations_bytes + self.logits_bytes + self.cuda_context_bytes + self.comm_buffer_bytes
        )  # fmt: skip

    @property
    def peak_moment(self) -> str:
        """The moment of the step whose tensors peak (``loss``, ``layer``, ``last layer`` or ``optimizer``)."""
        return max(self.moments, key=self.moments.get)

    @property
    def peak_bytes(self) -> int:
        """The device peak: the tensors of the fullest moment (``moments``) plus the CUDA context and NCCL
        buffers (stated constants). ``hardware.verdict`` decides on the need; this tells tight from does not fit."""
        return self.moments[self.peak_moment] + self.cuda_context_bytes + self.comm_buffer_bytes

    def components(self) -> dict[str, int]:
        """Device components in display order (what the stacked bars draw)."""
        keys = ["params", "grads", "master", "optimizer", "gathered", "grad_buffer", "no_sync_grads"]
        keys += ["activations", "logits"]
        out = {k: getattr(self, f"{k}_bytes") for k in keys}
        out.update(cuda_context=self.cuda_context_bytes, comm_buffers=self.comm_buffer_bytes)
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "static_bytes": self.static_bytes, "peak_bytes": self.peak_bytes,
                "peak_moment": self.peak_moment, "components_sum_bytes": self.components_sum_bytes,
                "reserved_bytes": self.reserved_bytes, "device_need_bytes": self.device_need_bytes}  # fmt: skip


def estimate_memory(
    model="smollm3-3b",
    *,
    world_size: int = 1,
    strategy: str = "FULL_SHARD",
    recipe: str = "hf-fsdp-bf16",
    seq_len: int = 2048,
    micro_batch: int = 1,
    lora: LoraSpec | bool | None = None,
    offload: bool = False,
    activation_checkpointing: bool = False,
    fsdp_version: int = 2,
    gpus_per_node: int = 8,
    rank: int = 0,
    loading: str = "every-rank",
    no_sync: bool = False,
    gradient_accumulation_steps: int = 1,
    lora_layout: str = "in-unit",
    legacy_hf_loss: bool = False,
    loss_path: str = "transformers",
    adamw: str = "foreach",
    ac_mode: str = "full", ac_every: int | None = None, packing: bool = False,
) -> MemoryEstimate:  # fmt: skip
    """Per-rank bytes of training ``model`` (a name for ``resolve_model_config`` or a config).

    ``strategy``: NO_SHARD (DDP-like replica), SHARD_GRAD_OP (ZeRO-2: units stay gathered from forward to
    backward), FULL_SHARD (ZeRO-3), HYBRID_SHARD (shard within ``gpus_per_node``, replicate across nodes).
    ``rank`` 0 is the fullest (padding lands on the last ranks). Static terms follow ``sharded_state``;
    activations ``activation_breakdown``; offload moves the static terms to ``host_bytes`` (FSDP1
    ``CPUOffload(offload_params=True)`` / FSDP2 ``CPUOffloadPolicy`` keep shards, gradients and optimizer state
    on the host). ``loading`` sets the load-time peaks (one of :data:`LOADINGS`, each explained there; model
    bytes at the recipe's ``param_bytes``: fp32 for the recipes smolfsdp runs, whose engines build fp32 ones).

    ``no_sync``: gradient accumulation runs its micro-batches under FSDP1 ``no_sync()`` (the Trainer does so
    with CPU offload, where FSDP1 accepts nothing else; ``smolfsdp.train.trl_engine.accumulates_under_no_sync``):
    every rank then also holds the whole unsharded gradient of the trainable parameters in the compute dtype
    (``no_sync_grads_bytes``; torch ``FullyShardedDataParallel.no_sync``: "accumulated ... in the unsharded form").
    ``lora_layout``: :data:`LORA_LAYOUTS`; ``legacy_hf_loss``: :data:`LEGACY_HF_LOSS`; ``ac_mode``:
    :func:`_activations`; ``loss_path``: :data:`LOSS_PATHS`, the code computing the loss (``measure.loss_path``).
    ``gradient_accumulation_steps`` > 1: the last micro-batch's backward starts with every gradient shard held.
    ``peak_bytes``: the fullest moment of a step (``moments``), held to the full-size dry run, plus constants;
    ``adamw``: its AdamW step (``adamw_step``: ``foreach`` adds a v-sized temporary, ``fused`` none). ``packing``: :func:`_state`.
    On the device every loading peaks at the largest FSDP unit held in full (the root or a layer): FSDP
    moves one unit at a time to the device and shards it there; the whole model never sits on one GPU.

    Raises ConfigError for an unknown strategy/recipe/loading/``adamw``, world size < 1, a sequence longer than
    the model's ``max_position_embeddings``, or an unresolvable model.
    """
    rec = _check_inputs(strategy, recipe, loading, world_size, fsdp_version, micro_batch, seq_len, rank)
    config = _check_seq_len(resolve_model_config(model), seq_len)
    spec = LoraSpec() if lora is True else (lora or None)
    group = shard_group_size(strategy, world_size, gpus_per_node)
    st, act, units = _state(config, rec, group, rank, fsdp_version, spec, lora_layout, seq_len, micro_batch, packing)  # fmt: skip
    act, _ = with_loss_path(act, loss_path, micro_batch * seq_len, config, rec.compute_bytes, legacy_hf_loss)
    full, c = st["full_units"], rec.compute_bytes
    static = {k: st[k] for k in ("params", "grads", "master", "optimizer")}
    host = sum(static.values()) if offload else 0
    static = dict.fromkeys(static, 0) if offload else static
    counts = count_parameters(config, spec)
    per_node = min(world_size, gpus_per_node)
    est = MemoryEstimate(
        model=str(model if isinstance(model, str) else config.model_type),
        world_size=world_size, strategy=strategy, recipe=rec.name, fsdp_version=fsdp_version,
        seq_len=seq_len, micro_batch=micro_batch, lora=spec is not None, offload=offload,
        activation_checkpointing=activation_checkpointing, rank=rank, shard_group=group,
        params_bytes=static["params"], grads_bytes=static["grads"], master_bytes=static["master"],
        optimizer_bytes=static["optimizer"], gathered_bytes=_gathered_bytes(strategy, group, rec, full),
        grad_buffer_bytes=_grad_buffer_bytes(config, rec, full, 2 if units else fsdp_version, spec),
        **_activations(config, act, micro_batch * seq_len, c, spec, activation_checkpointing, ac_mode, ac_every),
        logits_bytes=logits_component_bytes(loss_path, micro_batch * seq_len, config.vocab_size, config.hidden_size, c),
        cuda_context_bytes=CUDA_CONTEXT_BYTES, comm_buffer_bytes=COMM_BUFFER_BYTES if world_size > 1 else 0,
        host_bytes=host, n_step_tensors=st["n_step_tensors"],
        load_peak_device_bytes=max(n for n, _ in full.values()) * rec.param_bytes,
        load_peak_host_bytes_per_node={"every-rank": per_node, "rank0": 1, "meta": 0}[loading]
        * counts.total * rec.param_bytes,
        notes=_notes(rec, fsdp_version, spec, lora_layout), lora_layout=lora_layout, loss_fp32_copies=2 + legacy_hf_loss, loss_path=loss_path,
        no_sync_grads_bytes=counts.trainable * c if no_sync and group > 1 else 0, ac_mode=ac_mode, ac_every=ac_every, adamw=check_choice(adamw, tuple(ADAMW_IMPLS), "adamw"),
    )  # fmt: skip
    est.record_stream_bytes = _record_stream_bytes(config, rec, group, fsdp_version, spec, lora_layout)
    return _with_moments(est, config, gradient_accumulation_steps, spec)


def _record_stream_bytes(config, rec: Recipe, group: int, fsdp_version: int, spec, lora_layout: str) -> int:
    """FSDP1 only: the two ``record_stream`` blocks of ``smolfsdp.estimate.record_stream.fsdp1_stream_held``."""
    if fsdp_version != 1:
        return 0
    units = spec is not None and lora_layout == "adapter-units"
    held = fsdp1_stream_held(config, world_size=group, recipe=rec, lora=spec, adapter_units=units)
    return sum(held.values())


def _activations(
    config, act: dict, tokens: int, c: int, spec, enabled: bool, mode: str, every
) -> dict[str, int]:
    """``MemoryEstimate``'s bytes saved for backward: ``activations_no_ac_bytes`` (no checkpointing),
    ``activations_ac_bytes`` (every layer) and ``activations_bytes`` (``mode`` and ``every`` when ``enabled``:
    ``smolfsdp.ac_options``, modelled by ``smolfsdp.estimate.selective_ac_bytes``). Raises ConfigError for a policy
    ``check_ac_options`` refuses."""
    check_ac_options(enabled, mode, every)
    rest = act["head"] + act["rope"] + act["loss"]
    out = {}
    asked = mode if enabled else None
    for name, m in (
        ("activations_no_ac_bytes", None),
        ("activations_ac_bytes", "full"),
        ("activations_bytes", asked),
    ):
        kept, recompute = checkpointed_bytes(config, act, tokens, c, m, every, spec)
        out[name] = kept + recompute + rest
    return out


def _with_moments(est: MemoryEstimate, config, steps: int, spec) -> MemoryEstimate:
    """``est`` with its ``moments`` (``peak_moments``, the ``peak`` key left out)."""
    est.moments = {k: v for k, v in peak_moments(est, config, steps, spec).items() if k != "peak"}
    return est


def _state(config, rec: Recipe, group: int, rank: int, fsdp_version: int, spec, lora_layout: str, seq_len, mb, packing):  # fmt: skip
    """(``sharded_state``, ``activation_breakdown``, adapters as own units) for ``lora_layout`` (ConfigError
    for an unknown one). ``packing``: one flattened row on SDPA's masked path (``smolfsdp.estimate.packed``)."""
    check_choice(lora_layout, LORA_LAYOUTS, "lora_layout")
    units = fsdp_version == 1 and lora_layout == "adapter-units"
    st = sharded_state(config, rec, group, rank % group, fsdp_version, spec, adapter_units=units)
    base_grads = fsdp_version == 1 and not units
    act = activation_breakdown(config, mb * seq_len, seq_len, rec.compute_bytes, spec, base_grads=base_grads)
    return st, with_packed_attention(act, config, mb, seq_len, rec.compute_bytes) if packing else act, units


def _check_inputs(strategy, recipe, loading, world_size, fsdp_version, micro_batch, seq_len, rank) -> Recipe:
    """The recipe called ``recipe``, after the checks that need no model; ConfigError otherwise."""
    check_choice(strategy, STRATEGIES, "strategy")
    rec = RECIPES[check_choice(recipe, list(RECIPES), "recipe")]
    check_choice(loading, LOADINGS, "loading")
    if int(world_size) < 1:
        raise ConfigError(f"world_size={world_size}: need at least 1 GPU.")
    if fsdp_version not in (1, 2):
        raise ConfigError(f"fsdp_version={fsdp_version}: FSDP is version 1 or 2.")
    if micro_batch < 1 or seq_len < 1:
        raise ConfigError("micro_batch and seq_len must be at least 1.")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} is outside world size {world_size}.")
    return rec


def _check_seq_len(config, seq_len: int):
    if seq_len > (most := config.max_position_embeddings):
        raise ConfigError(f"seq_len={seq_len} is above the model's max_position_embeddings={most}.")
    return config


def shard_group_size(strategy: str, world_size: int, gpus_per_node: int) -> int:
    """Ranks one parameter is sharded over: 1 (NO_SHARD), a node (HYBRID_SHARD), else the world.

    Raises ConfigError for HYBRID_SHARD when the world does not split into whole shard groups.
    """
    if strategy == "NO_SHARD":
        return 1
    if strategy == "HYBRID_SHARD":
        group = min(world_size, gpus_per_node)
        if world_size % group:
            raise ConfigError(
                f"HYBRID_SHARD needs world_size ({world_size}) divisible by gpus_per_node ({group})."
            )
        return group
    return world_size


def _gathered_bytes(strategy: str, group: int, rec: Recipe, full: dict) -> int:
    """Full units held at once in the compute dtype (``full``: ``sharded_state``'s ``full_units``)."""
    c = rec.compute_bytes
    layer_full = max((n for k, (n, _) in full.items() if k != "root"), default=0)
    if strategy == "SHARD_GRAD_OP":
        return sum(n for n, _ in full.values()) * c  # no reshard after forward
    if group == 1 and c == rec.param_bytes:
        return 0  # the replica is the compute copy
    return (full["root"][0] + 2 * layer_full) * c  # root kept for backward; current + prefetched


def _grad_buffer_bytes(config, rec: Recipe, full: dict, fsdp_version: int, spec: LoraSpec | None) -> int:
    """The largest layer's unsharded gradient (compute dtype) plus its reduce-scatter input (grad dtype).

    FSDP1 reduces a whole FlatParameter that holds a trainable parameter; FSDP2 only the trainable
    parameters (with LoRA: the adapters).
    """
    trainable_full = [n for k, (n, t) in full.items() if t and k != "root"]
    if fsdp_version == 2 and spec is not None:
        units = model_units(config, spec)
        trainable_full = [sum(p.numel for p in ps if p.trainable) for k, ps in units.items() if k != "root"]
    return max(trainable_full, default=0) * (rec.compute_bytes + rec.grad_bytes)


def _notes(rec: Recipe, fsdp_version: int, spec: LoraSpec | None, lora_layout: str = "in-unit") -> list[str]:
    notes = []
    if fsdp_version == 1 and spec is not None and lora_layout == "adapter-units":
        notes.append("FSDP1 + LoRA, adapters as their own FSDP units: the frozen base gets no gradient.")
    elif fsdp_version == 1 and spec is not None:
        notes.append("FSDP1 + LoRA: each FlatParameter with an adapter gets a gradient for its whole shard.")
    if rec.name == "seed-table":
        notes.append(
            "seed-table keeps bf16 weights with fp32 m, v and no master: no torch FSDP recipe does this."
        )
    return notes


def format_table(est: MemoryEstimate) -> str:
    """A readable per-rank breakdown (GiB = 2**30 bytes)."""
    rows = [*est.components().items(), ("= sum of the components (not a bound)", est.components_sum_bytes),
            (f"tensors at the peak ({est.peak_moment} moment)", est.moments[est.peak_moment]),
            ("= device peak (+ CUDA context, NCCL)", est.peak_bytes), ("host (offload), per rank", est.host_bytes),
            ("load-time peak, host per node", est.load_peak_host_bytes_per_node)]  # fmt: skip
    head = (
        f"{est.model}: {est.strategy} over {est.world_size} GPU{'s' * (est.world_size != 1)} "
        f"(shard group {est.shard_group}), recipe {est.recipe}, FSDP{est.fsdp_version}, seq {est.seq_len} x "
        f"micro-batch {est.micro_batch}{', LoRA' if est.lora else ''}{', offload' if est.offload else ''}"
        f"{', activation checkpointing' + _ac_label(est) if est.activation_checkpointing else ''}, {est.adamw} AdamW"
    )
    width = max(len(k) for k, _ in rows)
    lines = [head, "-" * len(head)] + [f"{k:<{width}}  {v / GIB:10.3f} GiB" for k, v in rows]
    return "\n".join(lines + [f"note: {n}" for n in est.notes])


def _ac_label(est: MemoryEstimate) -> str:
    """`` (one layer in 2)`` or `` (op-level selective)`` after "activation checkpointing"; nothing for full."""
    return {"layer": f" (one layer in {est.ac_every})", "op": " (op-level selective)"}.get(est.ac_mode, "")
