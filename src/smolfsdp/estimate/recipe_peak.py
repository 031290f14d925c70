"""One peak per recipe: the estimated per-GPU peak of a run recipe, with the settings it was computed at.

Every page that quotes the peak of the book's recipe (``configs/runs/smollm3_3b_medical.yaml``: SmolLM3-3B,
FSDP1 ``FULL_SHARD`` on 2 GPUs) calls :func:`recipe_peak` and prints :attr:`RecipePeak.settings_line` beside
the number, so equal settings give the equal number on every page and unequal ones say how they differ:
chapter "Where the memory goes" (beside the dry run's traced row), "LoRA + FSDP2" (``book.fsdp_versions``),
"What the seeds say" (``smolfsdp.audit.seeds.memory_claims``) and ``smolfsdp dryrun`` (the CLI). ``tests/test_recipe_peak.py``
holds them to it.

The moment of the peak is named as the estimator names it (``smolfsdp.estimate.moments``): ``loss`` (backward
has just started, the loss's fp32 tensors alive), ``layer``, ``last layer``, ``optimizer``.
:func:`traced_moment` puts a dry run's traced phase and module in those words.

    python -c "from smolfsdp.estimate.recipe_peak import recipe_peak; print(recipe_peak().text())"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smolfsdp.config import TrainConfig, load_config
from smolfsdp.estimate.adamw_step import ADAMW_WORDS, engine_optimizer, traced_adamw
from smolfsdp.estimate.loss_path import engine_loss_path
from smolfsdp.estimate.memory import MemoryEstimate, estimate_memory
from smolfsdp.estimate.packed import MASKED_PATH
from smolfsdp.estimate.params import LoraSpec
from smolfsdp.paths import recipe

GIB = 2**30
BOOK_RECIPE = "smollm3_3b_medical"
#: what a peak counts: ``tensors`` (what ``torch.cuda.memory_allocated`` and the dry run see) or ``device``
#: (tensors + the CUDA context and NCCL buffers, stated constants in ``smolfsdp.estimate.memory``)
INCLUDES = {"tensors": "tensors only", "device": "tensors + CUDA context and NCCL buffers"}
#: the estimator's moments in a reader's words (``smolfsdp.estimate.moments``)
MOMENT_TEXT = {
    "loss": "the loss moment (backward has just started)",
    "layer": "the layer moment (the last decoder layer's backward)",
    "last layer": "the last-layer moment (the first decoder layer's backward, the end of backward)",
    "optimizer": "the optimizer moment (AdamW's step)",
    "embedding": "the embedding moment (the end of backward: the root's gradients summed)",
    "root reduce-scatter": "the root reduce-scatter moment (the end of backward: the root's gradient reduced)",
    "first layer forward": "the first-layer-forward moment (FSDP2: the root's all-gather output still held)",
}


#: the loss paths (``smolfsdp.estimate.loss_path``) in a reader's words, for the settings line
LOSS_WORDS = {
    "transformers": "transformers' loss (logits held)",
    "trl-fused-lm-head": "TRL's fused LM-head loss (no logits)",
    "torchtitan": "torchtitan's loss (logits freed)",
    "torchtitan-fp32-held": "torchtitan's loss (fp32 logits held)",
}


def recipe_settings(cfg: TrainConfig | str = BOOK_RECIPE, **overrides) -> dict:
    """``estimate_memory`` keyword arguments (``model`` included) for the setup ``cfg`` runs: a run recipe's
    name under ``configs/runs/`` or a ``TrainConfig``. World size = ``nproc``, its sharding strategy, sequence =
    ``max_length``, micro-batch, gradient accumulation, activation checkpointing (its policy), FSDP version, CPU
    offload, LoRA (its dropout and FSDP1 layout included), the precision recipe smolfsdp's engines keep (fp32 state, bf16 compute
    under ``mixed_precision: bf16``), the engine's loss (``loss_path.engine_loss_path``: TRL's fused LM head)
    and the AdamW step it builds on a GPU (``adamw_step.engine_optimizer``: fused for TRL, foreach for native).
    ``overrides`` replace any of them (e.g. ``gradient_accumulation_steps=1``)."""
    if isinstance(cfg, str):
        cfg = load_config(recipe(cfg))
    lora = (
        LoraSpec(cfg.lora_r, cfg.lora_alpha, tuple(cfg.lora_target_modules), cfg.lora_dropout)
        if cfg.lora
        else None
    )
    settings = dict(
        model=cfg.model,
        world_size=cfg.nproc, strategy=cfg.sharding_strategy,
        recipe="hf-fsdp-bf16" if cfg.mixed_precision == "bf16" else "fp32", seq_len=cfg.max_length,
        micro_batch=cfg.per_device_train_batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        activation_checkpointing=cfg.activation_checkpointing, fsdp_version=cfg.fsdp_version,
        offload=cfg.cpu_offload, lora=lora, loss_path=engine_loss_path(cfg.engine), adamw=engine_optimizer(cfg.engine),
        ac_mode=cfg.ac_mode, ac_every=cfg.ac_every, packing=cfg.packing and cfg.attn_implementation in MASKED_PATH,
        lora_layout=cfg.lora_layout if cfg.lora and cfg.fsdp_version == 1 else "in-unit",
    )  # fmt: skip
    unknown = set(overrides) - set(settings)
    if unknown:
        raise TypeError(f"recipe_settings: unknown settings {sorted(unknown)}; known: {sorted(settings)}")
    return {**settings, **overrides}


def settings_from_setup(setup: dict) -> dict:
    """The settings :func:`settings_line` reads, from a dry run's ``setup`` (``DryRun.setup``, a committed grid
    row's ``setup``): the same words for a traced peak as for an estimated one (its optimizer: ``traced_adamw``)."""
    return dict(
        world_size=setup["world_size"], strategy=setup["sharding_strategy"], fsdp_version=setup["fsdp_version"],
        seq_len=setup["max_length"], micro_batch=setup["per_device_train_batch_size"],
        gradient_accumulation_steps=setup["gradient_accumulation_steps"],
        activation_checkpointing=setup["activation_checkpointing"], lora=setup["lora"],
        offload=setup.get("cpu_offload", False), loss_path=setup.get("loss_path", "transformers"),
        adamw=traced_adamw(setup), packing=setup.get("packing", False),
    )  # fmt: skip


def settings_line(settings: dict, include: str = "tensors") -> str:
    """One line saying what a peak was computed at: ranks and strategy, micro-batch x sequence, micro-batches
    per optimizer step, activation checkpointing, LoRA, the loss, the AdamW step, offload, and what it counts
    (:data:`INCLUDES`)."""
    s = settings
    parts = [
        f"FSDP{s['fsdp_version']} {s['strategy']} x {s['world_size']}",
        f"micro-batch {s['micro_batch']} x {s['seq_len']:,} tokens"
        + (" packed into one row" if s.get("packing") else ""),
        f"gradient accumulation {s['gradient_accumulation_steps']}",
        f"activation checkpointing {'on' if s['activation_checkpointing'] else 'off'}",
        "LoRA" if s.get("lora") else "full fine-tune",
        LOSS_WORDS.get(s.get("loss_path", "transformers"), s.get("loss_path")),
        ADAMW_WORDS[s.get("adamw", "foreach")],
    ]
    if s.get("offload"):
        parts.append("CPU offload")
    return ", ".join(parts) + f"; {INCLUDES[include]}"


@dataclass(frozen=True)
class RecipePeak:
    """The estimated peak per GPU (rank 0) of one setup: ``bytes`` at ``moment``, counting ``include``."""

    bytes: int
    moment: str  # one of MOMENT_TEXT's keys
    include: str  # one of INCLUDES' keys
    settings: dict = field(repr=False)
    estimate: MemoryEstimate = field(repr=False)

    @property
    def gib(self) -> float:
        return self.bytes / GIB

    @property
    def settings_line(self) -> str:
        return settings_line(self.settings, self.include)

    def text(self, digits: int = 1) -> str:
        """``"31.0 GiB at the loss moment (...); settings: ..."``: the number with its moment and settings."""
        return f"{self.gib:,.{digits}f} GiB at {MOMENT_TEXT[self.moment]}; settings: {self.settings_line}"


def recipe_peak(cfg: TrainConfig | str = BOOK_RECIPE, *, include: str = "tensors", **overrides) -> RecipePeak:
    """The estimated per-GPU peak of ``cfg``'s setup (:func:`recipe_settings` with ``overrides``):
    ``include="tensors"`` the fullest moment's tensor bytes (what the dry run traces), ``"device"`` those plus
    the CUDA context and NCCL buffers. Raises ValueError for another ``include``, and what ``estimate_memory``
    raises."""
    if include not in INCLUDES:
        raise ValueError(f"include={include!r}: use one of {list(INCLUDES)}")
    settings = recipe_settings(cfg, **overrides)
    kwargs = {k: v for k, v in settings.items() if k != "model"}
    est = estimate_memory(settings["model"], gpus_per_node=max(8, settings["world_size"]), **kwargs)
    tensors = est.moments[est.peak_moment]
    extra = est.cuda_context_bytes + est.comm_buffer_bytes if include == "device" else 0
    return RecipePeak(tensors + extra, est.peak_moment, include, settings, est)


def traced_moment(peak_moment: dict) -> str:
    """A dry run's traced peak (``{"phase": ..., "module": ...}``) as the estimator's moment: ``optimizer``;
    ``loss`` for backward outside any decoder layer (the loss's tensors as backward starts); ``last layer``
    for backward in ``layers.0``; ``layer`` for backward in another layer; else the phase itself."""
    phase, module = peak_moment.get("phase", "?"), peak_moment.get("module", "")
    if phase == "optimizer":
        return "optimizer"
    if phase == "backward":
        if ".layers." not in f".{module}.":
            return "loss"
        return "last layer" if ".layers.0." in f"{module}." else "layer"
    return phase


def moment_words(moment: str) -> str:
    """``"the loss moment (backward has just started)"`` for a moment of :data:`MOMENT_TEXT`, else
    ``"<phase>"``."""
    return MOMENT_TEXT.get(moment, moment)
