"""Memory math for FSDP fine-tuning: exact parameter counts and per-rank bytes, component by component.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``). Everything here is a pure function
of a model config (built on the meta device, no weights): how many parameters, how FSDP1
(``FlatParameter`` per unit) or FSDP2 (``DTensor`` ``Shard(0)`` per parameter) lays them out and pads
them on each rank, and what a recipe keeps per parameter. ``smolfsdp.measure.memory_measure`` counts the
same bytes on real ranks; the tests hold the two to 1%.

    smolfsdp memory --model smollm3-3b --gpus 2 --strategy FULL_SHARD --recipe hf-fsdp-bf16 --seq-len 4096
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path

from smolfsdp.errors import ConfigError, nearest

GIB = 2**30

#: CUDA context + kernel images per process. Not visible to ``torch.cuda.memory_allocated``; with lazy
#: module loading (the default since CUDA 11.7) it is typically 0.3-1 GiB depending on GPU, driver and
#: libraries (PyTorch "CUDA semantics" notes; nvidia-smi on an idle process). A stated assumption.
CUDA_CONTEXT_BYTES = 512 * 2**20
#: NCCL communicator buffers per rank when world size > 1: NCCL_BUFFSIZE defaults to 4 MiB per
#: channel and peer (NCCL environment-variable docs); rings/trees with several channels put a
#: communicator in the hundreds of MiB. A stated assumption, not measured here.
COMM_BUFFER_BYTES = 256 * 2**20

STRATEGIES = ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
LOADINGS = ("every-rank", "rank0", "meta")
SHIPPED_MODELS = {
    "smollm3-3b": "data/models/smollm3_3b",
    "HuggingFaceTB/SmolLM3-3B": "data/models/smollm3_3b",
}


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter that a precision recipe keeps; ``0`` means the copy does not exist."""

    name: str
    param_bytes: int  # the sharded parameter storage
    grad_bytes: int  # the sharded gradient (FSDP reduces into it)
    master_bytes: int  # a separate fp32 master copy of trainable parameters
    state_bytes: int  # each of Adam's m and v
    compute_bytes: int  # gathered units and activations
    what: str

    @property
    def trainable_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.master_bytes + 2 * self.state_bytes


RECIPES = {
    r.name: r
    for r in (
        Recipe("fp32", 4, 4, 0, 4, 4, "fp32 everywhere; torch AdamW keeps m, v in the parameter dtype"),
        Recipe(
            "hf-fsdp-bf16", 4, 4, 0, 4, 2,
            "HF Trainer + FSDP with bf16=True: fp32 sharded params and grads, fp32 AdamW, bf16 compute "
            "(FSDP MixedPrecision casts only the gathered unit)",
        ),
        Recipe("pure-bf16", 2, 2, 0, 2, 2, "model loaded in bf16; AdamW m, v follow the bf16 params"),
        Recipe("seed-table", 2, 2, 0, 4, 2, "the seed's table: bf16 weights and grads, fp32 m and v, no master"),
        Recipe(
            "zero-paper", 2, 2, 4, 4, 2,
            "ZeRO mixed-precision Adam (Rajbhandari et al. 2020, sec. 3.1): 2+2+K, K=12 (fp32 master, m, v)",
        ),
        Recipe(
            "zero-mixed", 2, 4, 4, 4, 2,
            "ZeRO mixed precision with bf16 weights and fp32 gradient accumulation: 2+4+12 = 18 "
            "(Megatron-LM distributed-optimizer docs: 'bf16 param, fp32 grads: 18 bytes')",
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class LoraSpec:
    """peft ``LoraConfig(r, lora_alpha, target_modules)``: adapters ``A (r x in)`` and ``B (out x r)``."""

    r: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int
    dim0: int
    trainable: bool


# ------------------------------------------------------------------------------- model configs
def resolve_model_config(model, local_files_only: bool | None = None):
    """A ``PretrainedConfig`` from ``"smollm3-3b"`` (shipped), ``"tiny"``, a directory or a hub id.

    Raises ConfigError when a hub id cannot be resolved (offline): the config is needed, not weights.
    """
    import os

    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return model
    if model == "tiny":
        from smolfsdp.models.modeling import load_tokenizer, tiny_config

        return tiny_config(load_tokenizer("tiny"))
    if model in SHIPPED_MODELS:
        from smolfsdp.paths import repo_root

        return AutoConfig.from_pretrained(repo_root() / SHIPPED_MODELS[model])
    path = Path(str(model)).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} has no config.json; give a directory with the model's config.json.")
        return AutoConfig.from_pretrained(path)
    if "/" not in str(model):
        hint = nearest(model, ["tiny", *SHIPPED_MODELS])
        raise ConfigError(
            f"Unknown model {model!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + "; give 'smollm3-3b', 'tiny', a directory with config.json, or a hub id owner/name."
        )
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
    try:
        return AutoConfig.from_pretrained(model, local_files_only=local_files_only)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"Could not resolve {model!r} offline: the estimate needs only its config.json (no weights). "
            f"Download it where there is network (huggingface-cli download {model} config.json "
            "--local-dir DIR) and pass --model DIR."
        ) from err


@functools.lru_cache(maxsize=16)
def _units_cached(config_json: str, model_type: str, lora: LoraSpec | None):
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in json.loads(config_json).items() if k != "model_type"}
    config = AutoConfig.for_model(model_type, **kwargs)
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(config)
    wrap = next(n for n in net._no_split_modules if any(type(m).__name__ == n for m in net.modules()))
    layers = [(n, m) for n, m in net.named_modules() if type(m).__name__ == wrap]
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())

    def specs(module, prefix, skip):
        out = []
        for mname, mod in module.named_modules(prefix=prefix):
            if any(mname == s or mname.startswith(s + ".") for s in skip):
                continue
            for pname, p in mod.named_parameters(recurse=False):
                if id(p) in seen:  # tied weights (lm_head = embed_tokens) exist once
                    continue
                seen.add(id(p))
                out.append(ParamSpec(f"{mname}.{pname}", p.numel(), p.shape[0], lora is None))
                if lora and pname == "weight" and mname.rsplit(".", 1)[-1] in lora.targets:
                    out.append(ParamSpec(f"{mname}.lora_A", lora.r * p.shape[1], lora.r, True))
                    out.append(ParamSpec(f"{mname}.lora_B", p.shape[0] * lora.r, p.shape[0], True))
        return out

    seen: set[int] = set()
    units = {name: specs(mod, name, []) for name, mod in layers}
    root = specs(net, "", [n for n, _ in layers])
    return {"root": root, **units}, wrap, buffers


def model_units(config, lora: LoraSpec | None = None) -> dict[str, list[ParamSpec]]:
    """Parameters grouped as FSDP wraps them: ``"root"`` (embedding, final norm) then one unit per
    decoder layer, each in ``named_parameters`` order, with peft's LoRA adapters after each target."""
    return _units_cached(config.to_json_string(use_diff=False), config.model_type, lora)[0]


@dataclass(frozen=True)
class ParamCounts:
    total: int
    trainable: int
    embedding: int
    per_layer: int
    n_layers: int
    largest_unit: int
    largest_unit_name: str


def count_parameters(config, lora: LoraSpec | None = None) -> ParamCounts:
    """Exact counts from the config on the meta device (tied embeddings once), LoRA adapters included."""
    units = model_units(config, lora)
    sizes = {name: sum(p.numel for p in ps) for name, ps in units.items()}
    layers = [n for n in units if n != "root"]
    big = max(sizes, key=sizes.get)
    return ParamCounts(
        total=sum(sizes.values()),
        trainable=sum(p.numel for ps in units.values() for p in ps if p.trainable),
        embedding=config.vocab_size * config.hidden_size,
        per_layer=sizes[layers[0]],
        n_layers=len(layers),
        largest_unit=sizes[big],
        largest_unit_name=big,
    )


# ------------------------------------------------------------------------------ sharding layout
def _flat_layout(params: list[ParamSpec], group: int, rank: int, align: int) -> tuple[int, list[int]]:
    """FSDP1: one FlatParameter per unit. With ``use_orig_params`` each parameter starts at a multiple of
    16 bytes of the compute dtype and the total is padded to a multiple of the world size
    (torch/distributed/fsdp/_flat_param.py, ``_init_flat_param_and_metadata``); each rank holds
    ``ceil(total / group)`` elements. Returns (shard numel, this rank's elements of each parameter)."""
    offsets, end = [], 0
    for p in params:
        if align and end % align:
            end += align - end % align
        offsets.append(end)
        end += p.numel
    shard = -(-end // group)
    lo, hi = rank * shard, (rank + 1) * shard
    return shard, [max(0, min(hi, o + p.numel) - max(lo, o)) for o, p in zip(offsets, params, strict=True)]


def _dim0_layout(p: ParamSpec, group: int, rank: int) -> tuple[int, int]:
    """FSDP2: ``Shard(0)`` with dim 0 padded to a multiple of the group (torch.chunk sizes); every rank
    stores ``ceil(dim0 / group)`` rows. Returns (padded local numel, real local numel)."""
    rows = -(-p.dim0 // group)
    rest = p.numel // p.dim0
    return rows * rest, max(0, min(rows, p.dim0 - rank * rows)) * rest


def sharded_state(
    config, recipe: Recipe, group: int, rank: int = 0, fsdp_version: int = 2, lora: LoraSpec | None = None
) -> dict[str, int]:
    """Bytes of parameter shards, gradient shards, fp32 master and Adam m+v on ``rank`` of a shard group.

    Gradients exist only where autograd produces them: FSDP2 per trainable parameter; FSDP1 per
    FlatParameter that holds any trainable parameter (so a LoRA unit gets a gradient as large as its
    whole shard, frozen base included). Adam state covers only the real (unpadded) elements of
    trainable parameters on the rank; its ``step`` counters (one 0-d fp32 host tensor per parameter
    with local elements) are counted in ``n_step_tensors``.
    """
    out = dict.fromkeys(["params", "grads", "master", "optimizer", "n_step_tensors"], 0)
    out["full_units"] = {}
    align = 16 // recipe.compute_bytes
    for name, params in model_units(config, lora).items():
        if fsdp_version == 1:
            shard, local = _flat_layout(params, group, rank, align)
            padded = shard
            out["grads"] += shard * recipe.grad_bytes if any(p.trainable for p in params) else 0
            full = shard * group
        else:
            layout = [_dim0_layout(p, group, rank) for p in params]
            padded, local = sum(a for a, _ in layout), [b for _, b in layout]
            out["grads"] += (
                sum(a for (a, _), p in zip(layout, params, strict=True) if p.trainable) * recipe.grad_bytes
            )
            full = padded * group
        out["params"] += padded * recipe.param_bytes
        mine = [n for n, p in zip(local, params, strict=True) if p.trainable]
        out["optimizer"] += sum(mine) * 2 * recipe.state_bytes
        out["master"] += sum(mine) * recipe.master_bytes
        out["n_step_tensors"] += sum(1 for n in mine if n > 0)
        out["full_units"][name] = (full, any(p.trainable for p in params))
    return out


# ---------------------------------------------------------------------------------- activations
def activation_breakdown(config, tokens: int, seq_len: int, compute_bytes: int, lora: LoraSpec | None = None):
    """Bytes autograd saves for backward in one forward of ``tokens = micro_batch * seq_len`` tokens.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4)
    count ``s*b*h*(34 + 5*a*s/h)`` per GPT layer in fp16. For SmolLM3 (RMSNorm computed in fp32, GQA,
    SwiGLU, no dropout, SDPA/flash attention that keeps only q, k, v, the output and a fp32
    logsumexp, never the ``s^2`` scores) the same per-tensor accounting gives, per token and layer,
    with ``c`` the compute itemsize::

        8h + 6ch + 2c*kv + 4c*f + 4*heads + 8      (full fine-tune)

    2 norms x (fp32 input 4h + rsqrt 4 + normalised ch) + norm outputs saved by q/k/v and gate/up
    (2ch) + q (ch) + k, v (2c*kv) + attention output = o_proj input (ch) + logsumexp (4*heads) +
    SwiGLU gate, silu(gate), up, down input (4cf). With LoRA, frozen weights drop the saves that
    only their weight-gradient needs (norm ``ch``, gate/up and down inputs, lm_head input) and add
    ``c*r`` per adapter; layer 0's input norm saves nothing (its input needs no gradient). The loss
    saves the fp32 log-softmax (4V per token) and int64 targets (and the embedding its int64 ids). Checked byte for byte against
    ``torch.autograd.graph.saved_tensors_hooks`` in tests/test_memory.py.
    """
    h, f, heads, c = config.hidden_size, config.intermediate_size, config.num_attention_heads, compute_bytes
    hd = getattr(config, "head_dim", None) or h // heads
    kv, n_layers, V = config.num_key_value_heads * hd, config.num_hidden_layers, config.vocab_size
    attn_core = 2 * c * h + 2 * c * kv + 4 * heads  # q, output (= o_proj input), k, v, logsumexp
    if lora is None:
        norm = 4 * h + 4 + c * h
        layer = 2 * norm + 2 * c * h + attn_core + 4 * c * f
        first_layer_saving = 0
        head = norm + c * h  # final norm + lm_head input
        ids = 8 * tokens  # int64 input ids, saved for the embedding's weight gradient
    else:
        t = set(lora.targets)
        norm = 4 * h + 4
        linear_in = c * h * ((bool(t & {"q_proj", "k_proj", "v_proj"})) + bool(t & {"gate_proj", "up_proj"}))
        layer = (
            2 * norm + linear_in + attn_core + 3 * c * f + c * f * ("down_proj" in t) + c * lora.r * len(t)
        )
        first_layer_saving = norm
        head = norm
        ids = 0
    rope = 2 * seq_len * hd * c  # cos and sin, shared by every layer and every sequence
    layers_bytes = tokens * (n_layers * layer - first_layer_saving)
    loss = tokens * (4 * V + 8) + 4 + ids  # fp32 log-softmax, int64 targets, the 0-d loss scale
    return {
        "per_layer": tokens * layer,
        "layers": layers_bytes,
        "layer_inputs": tokens * n_layers * c * h,  # what per-layer activation checkpointing keeps
        "head": tokens * head,
        "rope": rope,
        "loss": loss,
        "logits": tokens * V * (c + (4 if c != 4 else 0)),  # logits held by the output + fp32 upcast
    }


def saved_activation_bytes(config, tokens: int, seq_len: int, compute_bytes: int, lora=None) -> int:
    """All bytes autograd holds for backward after forward + loss (no activation checkpointing)."""
    b = activation_breakdown(config, tokens, seq_len, compute_bytes, lora)
    return b["layers"] + b["head"] + b["rope"] + b["loss"]


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

    @property
    def static_bytes(self) -> int:
        """Parameter, gradient, master and optimizer bytes on the device (0 when offloaded)."""
        return self.params_bytes + self.grads_bytes + self.master_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        """Upper bound of the device peak: every component alive at once (gradients included)."""
        return (
            self.static_bytes + self.gathered_bytes + self.grad_buffer_bytes + self.no_sync_grads_bytes
            + self.activations_bytes + self.logits_bytes + self.cuda_context_bytes + self.comm_buffer_bytes
        )  # fmt: skip

    def components(self) -> dict[str, int]:
        """Device components in display order (what the stacked bars draw)."""
        keys = ["params", "grads", "master", "optimizer", "gathered", "grad_buffer", "no_sync_grads"]
        keys += ["activations", "logits"]
        out = {k: getattr(self, f"{k}_bytes") for k in keys}
        out.update(cuda_context=self.cuda_context_bytes, comm_buffers=self.comm_buffer_bytes)
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "static_bytes": self.static_bytes, "peak_bytes": self.peak_bytes}


def check_choice(value: str, options, what: str) -> str:
    if value in options:
        return value
    hint = nearest(value, options)
    raise ConfigError(
        f"Unknown {what} {value!r}"
        + (f"; did you mean {hint[0]!r}?" if hint else "")
        + f" Known: {', '.join(options)}."
    )


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
) -> MemoryEstimate:
    """Per-rank bytes of training ``model`` (a name for ``resolve_model_config`` or a config).

    ``strategy``: NO_SHARD (DDP-like replica), SHARD_GRAD_OP (ZeRO-2: units stay gathered from
    forward to backward), FULL_SHARD (ZeRO-3), HYBRID_SHARD (shard within ``gpus_per_node``,
    replicate across nodes). ``rank`` 0 is the fullest (padding lands on the last ranks). Static
    terms follow ``sharded_state``; activations ``activation_breakdown``; offload moves the static
    terms to ``host_bytes`` (FSDP1 ``CPUOffload(offload_params=True)`` / FSDP2 ``CPUOffloadPolicy``
    keep shards, gradients and optimizer state on the host).

    ``loading`` sets the load-time peaks (model bytes at the recipe's ``param_bytes``: fp32 for the
    recipes smolfsdp runs, whose engines build fp32 parameters):

    * ``every-rank`` (the default, what both smolfsdp engines do: ``modeling.build_model`` /
      ``from_pretrained`` in every process, then wrap): the host of a node holds one full model per
      process, ``min(world_size, gpus_per_node)`` of them at once.
    * ``rank0``: only local rank 0 loads, the others build on meta (``cpu_ram_efficient_loading`` with
      ``sync_module_states``, a Trainer option smolfsdp does not turn on): one full model per node.
    * ``meta``: build on meta, load each shard where it lives: nothing full on the host.

    ``no_sync``: gradient accumulation runs its micro-batches under FSDP1 ``no_sync()`` (the
    Trainer does so with CPU offload, where FSDP1 accepts nothing else; see
    ``smolfsdp.train.trl_engine.accumulates_under_no_sync``): every rank then also holds the whole unsharded
    gradient of the trainable parameters in the compute dtype (``no_sync_grads_bytes``; torch
    FullyShardedDataParallel.no_sync docstring: "gradients are accumulated ... in the unsharded form").

    On the device every loading peaks at the largest FSDP unit held in full (the root or a layer):
    FSDP moves one unit at a time to the device and shards it there (FSDP1 ``device_id``, FSDP2
    ``fully_shard``); the whole model never sits on one GPU.

    Raises ConfigError for an unknown strategy/recipe/loading, world size < 1, a sequence longer than
    the model's ``max_position_embeddings``, or an unresolvable model.
    """
    check_choice(strategy, STRATEGIES, "strategy")
    rec = RECIPES[check_choice(recipe, list(RECIPES), "recipe")]
    check_choice(loading, LOADINGS, "loading")
    if int(world_size) < 1:
        raise ConfigError(f"world_size={world_size}: need at least 1 GPU.")
    if fsdp_version not in (1, 2):
        raise ConfigError(f"fsdp_version={fsdp_version}: FSDP is version 1 or 2.")
    if micro_batch < 1 or seq_len < 1:
        raise ConfigError("micro_batch and seq_len must be at least 1.")
    config = resolve_model_config(model)
    if seq_len > config.max_position_embeddings:
        raise ConfigError(
            f"seq_len={seq_len} is above the model's max_position_embeddings={config.max_position_embeddings}."
        )
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} is outside world size {world_size}.")
    spec = LoraSpec() if lora is True else (lora or None)
    if strategy == "NO_SHARD":
        group = 1
    elif strategy == "HYBRID_SHARD":
        group = min(world_size, gpus_per_node)
        if world_size % group:
            raise ConfigError(
                f"HYBRID_SHARD needs world_size ({world_size}) divisible by gpus_per_node ({group})."
            )
    else:
        group = world_size
    st = sharded_state(config, rec, group, rank % group, fsdp_version, spec)
    full = st["full_units"]
    c = rec.compute_bytes
    layer_full = max((n for k, (n, _) in full.items() if k != "root"), default=0)
    if strategy == "SHARD_GRAD_OP":
        gathered = sum(n for n, _ in full.values()) * c  # no reshard after forward
    elif group == 1 and c == rec.param_bytes:
        gathered = 0  # the replica is the compute copy
    else:
        gathered = (full["root"][0] + 2 * layer_full) * c  # root kept for backward; current + prefetched
    trainable_full = [n for k, (n, t) in full.items() if t and k != "root"]
    if fsdp_version == 2 and spec is not None:
        units = model_units(config, spec)
        trainable_full = [sum(p.numel for p in ps if p.trainable) for k, ps in units.items() if k != "root"]
    grad_buffer = max(trainable_full, default=0) * (c + rec.grad_bytes)
    tokens = micro_batch * seq_len
    act = activation_breakdown(config, tokens, seq_len, c, spec)
    no_ac = act["layers"] + act["head"] + act["rope"] + act["loss"]
    with_ac = act["layer_inputs"] + act["per_layer"] + act["head"] + act["rope"] + act["loss"]
    static = {k: st[k] for k in ("params", "grads", "master", "optimizer")}
    host = sum(static.values()) if offload else 0
    if offload:
        static = dict.fromkeys(static, 0)
    counts = count_parameters(config, spec)
    full_model = counts.total * rec.param_bytes
    no_sync_grads = counts.trainable * c if no_sync and group > 1 else 0
    per_node = min(world_size, gpus_per_node)
    notes = []
    if fsdp_version == 1 and spec is not None:
        notes.append("FSDP1 + LoRA: each FlatParameter with an adapter gets a gradient for its whole shard.")
    if rec.name == "seed-table":
        notes.append(
            "seed-table keeps bf16 weights with fp32 m, v and no master: no torch FSDP recipe does this."
        )
    return MemoryEstimate(
        model=str(model if isinstance(model, str) else config.model_type),
        world_size=world_size, strategy=strategy, recipe=rec.name, fsdp_version=fsdp_version,
        seq_len=seq_len, micro_batch=micro_batch, lora=spec is not None, offload=offload,
        activation_checkpointing=activation_checkpointing, rank=rank, shard_group=group,
        params_bytes=static["params"], grads_bytes=static["grads"], master_bytes=static["master"],
        optimizer_bytes=static["optimizer"], gathered_bytes=gathered, grad_buffer_bytes=grad_buffer,
        activations_bytes=with_ac if activation_checkpointing else no_ac,
        activations_no_ac_bytes=no_ac, activations_ac_bytes=with_ac, logits_bytes=act["logits"],
        cuda_context_bytes=CUDA_CONTEXT_BYTES, comm_buffer_bytes=COMM_BUFFER_BYTES if world_size > 1 else 0,
        host_bytes=host, n_step_tensors=st["n_step_tensors"],
        load_peak_device_bytes=max(n for n, _ in full.values()) * rec.param_bytes,
        load_peak_host_bytes_per_node={"every-rank": per_node, "rank0": 1, "meta": 0}[loading] * full_model,
        notes=notes, no_sync_grads_bytes=no_sync_grads,
    )  # fmt: skip


# ------------------------------------------------------------------------ reference estimators
def accelerate_estimate(config, dtype: str = "float32") -> dict[str, int]:
    """What ``accelerate estimate-memory`` prints, reimplemented (accelerate 1.15,
    accelerate/commands/estimate.py ``gather_data`` + ``estimate_training_usage``).

    It sizes the meta model in fp32 (parameters, tied once, plus buffers), takes the largest
    no-split layer, and for "Training using Adam" reports the *largest* of its components, not
    their sum: float32 -> ``step = 4 x model`` (16 B/param); float16 -> ``optimizer = 2 x fp32
    model`` (8 B/param). No activations, no sharding, no batch size.
    """
    check_choice(dtype, ("float32", "float16"), "accelerate dtype")
    counts = count_parameters(config)
    buffers = _units_cached(config.to_json_string(use_diff=False), config.model_type, None)[2]
    fp32 = counts.total * 4 + buffers
    largest = max(counts.per_layer, counts.embedding) * 4
    if dtype == "float32":
        parts = {"model": fp32, "gradients": fp32, "optimizer": 2 * fp32, "step": 4 * fp32}
        size = fp32
    else:
        parts = {"model": fp32, "gradients": fp32 + fp32 // 2, "optimizer": 2 * fp32, "step": 2 * fp32}
        size, largest = fp32 // 2, largest // 2
    return {
        "total_bytes": size,
        "largest_layer_bytes": largest,
        "training_bytes": max(parts.values()),
        **parts,
    }


def deepspeed_zero3_estimate(
    total_params: int,
    largest_layer_params: int,
    gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = False,
    cpu_offload_params: bool = False,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> dict[str, int]:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage3.py),
    reimplemented: per-GPU ``18 * params / gpus + 4 * largest_layer`` without offload (18 = fp16
    params 2 + fp16 grads 2 + fp32 master, m, v 12 + 2 for the fp32 gradient partition); model
    states only (no activations); host sized with a 1.5x buffer factor. ``largest_layer_params`` is
    the module with the most direct parameters (for SmolLM3: the embedding).
    """
    total_gpus = gpus_per_node * num_nodes
    largest = 4 * largest_layer_params
    if cpu_offload and cpu_offload_params:
        gpu, cpu = largest, total_params * 18 / num_nodes * additional_buffer_factor
    elif cpu_offload:
        gpu = largest + int(2 * total_params / total_gpus)
        cpu = total_params * 16 / num_nodes * additional_buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        cpu = largest_layer_params * 4 * gpus_per_node * additional_buffer_factor
    if not zero_init and cpu_offload:
        cpu = (
            total_params
            * max(4 * gpus_per_node, (18 if cpu_offload_params else 16) / num_nodes)
            * additional_buffer_factor
        )
    elif not zero_init:
        cpu = total_params * 4 * gpus_per_node * additional_buffer_factor
    return {"gpu_bytes": int(gpu), "cpu_bytes_per_node": int(cpu), "largest_layer_bytes": largest}


def format_table(est: MemoryEstimate) -> str:
    """A readable per-rank breakdown (GiB = 2**30 bytes)."""
    rows = [(k, v) for k, v in est.components().items()]
    rows += [("= device peak (upper bound)", est.peak_bytes), ("host (offload), per rank", est.host_bytes)]
    rows += [("load-time peak, host per node", est.load_peak_host_bytes_per_node)]
    head = (
        f"{est.model}: {est.strategy} over {est.world_size} GPU(s) (shard group {est.shard_group}), "
        f"recipe {est.recipe}, FSDP{est.fsdp_version}, seq {est.seq_len} x micro-batch {est.micro_batch}"
        f"{', LoRA' if est.lora else ''}{', offload' if est.offload else ''}"
        f"{', activation checkpointing' if est.activation_checkpointing else ''}"
    )
    width = max(len(k) for k, _ in rows)
    lines = [head, "-" * len(head)] + [f"{k:<{width}}  {v / GIB:10.3f} GiB" for k, v in rows]
    return "\n".join(lines + [f"note: {n}" for n in est.notes])
