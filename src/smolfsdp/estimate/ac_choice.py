"""Activation checkpointing chosen by card: the least recomputation whose reserved estimate fits.

Checkpointing buys memory with compute, so a run should use as little as the card allows. For a run's settings
(``smolfsdp memory``'s, or a recipe's) and one GPU, :func:`choose_checkpointing` tries, least recomputation first:
``off``; op-level selective (``ac_mode: op``); every 2nd layer (``ac_mode: layer``, ``ac_every: 2``); ``full``. It
takes the first whose fit verdict (``smolfsdp.estimate.hardware.fit_verdict``: reserved memory + CUDA context + NCCL
within the card) is ``fits``. The selective modes run on the native engine only (the Trainer applies full
checkpointing), so for the TRL engine the choice is off or full. The tokens/s gain over full checkpointing comes from
the package's one step-time model (``smolfsdp.estimate.scaling.estimate_step`` with ``activation_checkpointing`` on
and off: its MFU is the calibrated HFU less what each mode recomputes, ``smolfsdp.estimate.recompute``); an estimate,
never a measurement.

SmolLM3-3B's recipe (2 GPUs, FSDP1, micro-batch 2 x 2,048 tokens, TRL engine) needs 55.1 GiB reserved without
checkpointing: off on an 80 GB card (74.5 GiB), +22 % tokens/s on an H100 SXM; full on an A100 40GB.

    smolfsdp memory --config configs/runs/smollm3_3b_medical.yaml --gpu "A100 80GB"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.hardware import GPU, FitVerdict, fit_verdict
from smolfsdp.estimate.memory import estimate_memory

#: The settings tried, least recomputation first (``smolfsdp.estimate.recompute``: op-level selective recomputes
#: less than every 2nd layer for SmolLM3), each as the recipe fields that ask for it.
AC_SETTINGS: dict[str, dict] = {
    "off": {"activation_checkpointing": False, "ac_mode": "full", "ac_every": None},
    "op": {"activation_checkpointing": True, "ac_mode": "op", "ac_every": None},
    "layer": {"activation_checkpointing": True, "ac_mode": "layer", "ac_every": 2},
    "full": {"activation_checkpointing": True, "ac_mode": "full", "ac_every": None},
}
#: The settings the TRL engine can run (the Trainer's FSDP applies full checkpointing or none).
TRL_SETTINGS = ("off", "full")
#: What a reader sets, per choice: the YAML keys and the ``smolfsdp train`` options.
OPTIONS = {
    "off": "--activation_checkpointing false",
    "op": "--activation_checkpointing true --ac_mode op",
    "layer": "--activation_checkpointing true --ac_mode layer --ac_every 2",
    "full": "--activation_checkpointing true --ac_mode full",
}


@dataclass
class CheckpointingChoice:
    """The answer of :func:`choose_checkpointing`.

    ``choice``: a key of :data:`AC_SETTINGS`, or ``"none fits"``; ``verdicts``: the fit verdict of each setting
    tried, in order; ``tokens_per_s``: estimated tokens/s per GPU of each setting that fits (``estimate_step``;
    empty for a custom GPU and LoRA); ``engine``, ``gpu``: what was asked;
    ``asked``: the setting the given settings already use."""

    choice: str
    verdicts: dict[str, FitVerdict]
    tokens_per_s: dict[str, float]
    engine: str
    gpu: str
    asked: str
    skipped: tuple[str, ...] = field(default=())

    @property
    def gain(self) -> float | None:
        """Estimated tokens/s of the choice over full checkpointing, as a fraction (0.22 = +22 %); None
        when either is not priced."""
        tps = self.tokens_per_s
        if self.choice not in tps or "full" not in tps:
            return None
        return tps[self.choice] / tps["full"] - 1

    @property
    def text(self) -> str:
        """Two or three lines for ``smolfsdp memory``: the choice with its verdict and tokens/s, what was tried
        first, and the options that set it when the settings ask for another."""
        if self.choice == "none fits":
            head = f"activation checkpointing on {self.gpu}: none fits at these settings (see the recommendation)"
        else:
            head = f"activation checkpointing on {self.gpu} ({self.engine} engine): {self.choice}: "
            head += self.verdicts[self.choice].line
            if self.choice in self.tokens_per_s:
                head += f"; an estimated {self.tokens_per_s[self.choice]:,.0f} computed tokens/s per GPU"
                if self.choice != "full" and self.gain is not None:
                    head += f", {self.gain:+.0%} over full checkpointing"
                head += " (smolfsdp.estimate.scaling.estimate_step)"
        lines = [head]
        before = [k for k in self.verdicts if k != self.choice]
        if before:
            lines.append("  tried: " + "; ".join(f"{k}: {self.verdicts[k].line}" for k in before))
        if self.skipped:
            lines.append(
                f"  not tried: {', '.join(self.skipped)} (selective checkpointing: native engine only)"
            )
        if self.choice in OPTIONS and self.choice != self.asked:
            lines.append(f"  the settings ask for {self.asked}: train with {OPTIONS[self.choice]}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "choice": self.choice,
            "asked": self.asked,
            "engine": self.engine,
            "gpu": self.gpu,
            "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
            "tokens_per_s_per_gpu": {k: round(v, 1) for k, v in self.tokens_per_s.items()},
            "gain_over_full": None if self.gain is None else round(self.gain, 4),
            "options": OPTIONS.get(self.choice),
        }


def asked_setting(settings: dict) -> str:
    """The key of :data:`AC_SETTINGS` that ``settings`` (``estimate_memory`` keywords) use."""
    if not settings.get("activation_checkpointing"):
        return "off"
    mode = settings.get("ac_mode", "full")
    return "layer" if mode == "layer" and settings.get("ac_every") == 2 else mode


def tokens_per_s(settings: dict, gpu: GPU, name: str) -> float | None:
    """Estimated tokens/s per GPU of ``settings`` with the checkpointing of ``name`` (``estimate_step``); None
    for LoRA (not priced here: ``time_model.plan_time`` prices a LoRA recipe) and a GPU without a bf16 peak in
    ``hardware.GPUS``. Computed tokens: padding and packing fill are not taken off."""
    from smolfsdp.estimate.scaling import estimate_step  # deferred: pandas, the collectives model

    if settings.get("lora"):
        return None
    ac = AC_SETTINGS[name]
    try:
        step = estimate_step(
            settings["model"],
            strategy=settings.get("strategy", "FULL_SHARD"),
            n_gpus=settings.get("world_size", 1),
            gpu=gpu.name,
            gpus_per_node=settings.get("gpus_per_node"),
            seq_len=settings.get("seq_len", 2048),
            micro_batch=settings.get("micro_batch", 1),
            gradient_accumulation_steps=settings.get("gradient_accumulation_steps", 1),
            fsdp_version=settings.get("fsdp_version", 2),
            **ac,
        )
    except ConfigError:  # a custom GPU (--gpu-memory-gib) has no bf16 peak to price compute on
        return None
    return float(step["tokens_per_s_per_gpu"])


def choose_checkpointing(settings: dict, gpu: GPU, engine: str = "native") -> CheckpointingChoice:
    """The least activation checkpointing whose estimate fits ``gpu`` for ``settings`` (``estimate_memory``
    keywords with ``model`` and ``world_size``, as ``cli_memory.memory_settings`` gives them; its
    ``gradient_accumulation_steps`` also sets the step time's). ``engine``: ``"trl"`` tries off and full only.
    Raises ConfigError for settings ``estimate_memory`` refuses."""
    kw = {k: v for k, v in settings.items() if k != "model"}
    names = [n for n in AC_SETTINGS if engine != "trl" or n in TRL_SETTINGS]
    skipped = tuple(n for n in AC_SETTINGS if n not in names)
    verdicts, choice = {}, "none fits"
    for name in names:
        est = estimate_memory(settings["model"], **{**kw, **AC_SETTINGS[name]})
        verdicts[name] = fit_verdict(est, gpu)
        if verdicts[name].fits:
            choice = name
            break
    priced = {}
    if choice != "none fits":
        for name in dict.fromkeys((choice, "full")):
            if (tps := tokens_per_s(settings, gpu, name)) is not None:
                priced[name] = tps
    return CheckpointingChoice(choice, verdicts, priced, engine, gpu.name, asked_setting(settings), skipped)
