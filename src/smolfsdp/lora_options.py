"""Where FSDP1 puts the LoRA adapters, by name, and the checks on it.

One source for the run config (``smolfsdp.config``: ``lora_layout``), the native engine and the dry run
(``smolfsdp.sharding.adapter_units`` wraps them) and the memory estimate (``smolfsdp.estimate.memory``
models both).

* ``in-unit`` (smolfsdp's default): each adapter shares its decoder layer's FlatParameter
  (``use_orig_params=True``), so FSDP1 gives that whole FlatParameter a gradient, frozen base included.
* ``adapter-units``: each adapter matrix (each leaf module whose weight requires a gradient) is its own FSDP
  unit, as AnswerDotAI/fsdp_qlora ``train.py`` and llama-recipes wrap them (an ``_or_policy`` of a
  ``lambda_auto_wrap_policy`` and the decoder-layer ``transformer_auto_wrap_policy``): the decoder layer's
  FlatParameter holds only frozen weights, so it has no gradient and no reduce-scatter.

    smolfsdp train --config configs/runs/lora_smoke.yaml --lora_layout adapter-units

Also TRL's quantised-loading options (QLoRA), which the package refuses with the reason (:data:`QUANTISED_REFUSAL`).
"""

from __future__ import annotations

from smolfsdp.errors import ConfigError, did_you_mean

LORA_LAYOUTS = ("in-unit", "adapter-units")


def check_lora_layout(layout: str, lora: bool, fsdp_version: int, engine: str = "native") -> None:
    """Raise ConfigError for a layout that cannot run: an unknown name, or ``adapter-units`` without LoRA,
    with FSDP2 (``fully_shard`` keeps one DTensor per parameter: there is no shared FlatParameter to split)
    or on the TRL engine (LoRA runs on the native engine only)."""
    if layout not in LORA_LAYOUTS:
        raise ConfigError(
            f"lora_layout={layout!r}: use one of {LORA_LAYOUTS}.{did_you_mean(layout, LORA_LAYOUTS)}"
        )
    if layout == "in-unit":
        return
    if not lora:
        raise ConfigError(
            "lora_layout: adapter-units wraps each LoRA adapter as its own FSDP1 unit; set lora: true."
        )
    if engine != "native":
        raise ConfigError(
            "lora_layout: adapter-units runs on the native engine only (the Trainer's FSDP1 wraps decoder "
            "layers only); set engine: native, or lora_layout: in-unit."
        )
    if int(fsdp_version) != 1:
        raise ConfigError(
            "lora_layout: adapter-units is an FSDP1 layout (FSDP2 shards each parameter as its own DTensor, "
            "so frozen weights never get a gradient); set fsdp_version: 1, or lora_layout: in-unit."
        )


def check_lora(cfg) -> None:
    """The LoRA fields of a ``smolfsdp.config.TrainConfig`` (called by its ``__post_init__``); normalises a
    comma-separated ``lora_target_modules`` string into a list. Raises ConfigError for a rank < 1, no target,
    a dropout outside [0, 1), LoRA on the TRL engine, FSDP1 LoRA with ``use_orig_params: false`` (for
    ``adapter-units`` too: each of its FlatParameters would be uniform, but smolfsdp's optimizer, clipping,
    checkpoint and adapter export are tested with original parameters only), and what
    :func:`check_lora_layout` refuses."""
    if cfg.lora:
        if cfg.lora_r <= 0:
            raise ConfigError(f"lora_r={cfg.lora_r}: the LoRA rank must be a positive integer (8 is usual).")
        if isinstance(cfg.lora_target_modules, str):
            cfg.lora_target_modules = [m.strip() for m in cfg.lora_target_modules.split(",") if m.strip()]
        if not cfg.lora_target_modules:
            raise ConfigError(
                "lora_target_modules is empty; name the linear layers to adapt, e.g. q_proj,v_proj."
            )
        if not 0 <= cfg.lora_dropout < 1:
            raise ConfigError(f"lora_dropout={cfg.lora_dropout} must be in [0, 1).")
        if cfg.engine != "native":
            raise ConfigError(
                "lora=true runs on the native engine (plain PyTorch loop + FSDP); set engine: native."
            )
        if cfg.fsdp_version == 1 and not cfg.use_orig_params:
            raise ConfigError(
                "LoRA with FSDP1 needs use_orig_params=true: with use_orig_params=false FSDP1 flattens each unit "
                "into one FlatParameter with a single requires_grad, so frozen base weights and trainable "
                "adapters cannot share a unit. Set use_orig_params: true, or use fsdp_version: 2."
            )
    check_lora_layout(cfg.lora_layout, cfg.lora, cfg.fsdp_version, cfg.engine)


#: TRL's quantisation options (``trl.ModelConfig``), refused with the reason rather than as unknown options
QUANTISED_LOADING = (
    "load_in_4bit",
    "load_in_8bit",
    "bnb_4bit_quant_type",
    "bnb_4bit_quant_storage",
    "use_bnb_nested_quant",
)
QUANTISED_REFUSAL = (
    "smolfsdp does not load models in 4 or 8 bits (QLoRA): bitsandbytes' quantised layers need a CUDA GPU, and FSDP1 "
    "shards them only when their packed bytes are stored in the other parameters' dtype (bnb_4bit_quant_storage); "
    "see `smolfsdp gotchas --run qlora_integer_storage` and the chapter 'Debugging the seams'. Use --lora on the "
    "bf16 model instead."
)
