"""Tokenizer and model: the SmolLM3-3B checkpoint, a local path, or the ``tiny`` preset.

The ``tiny`` preset is a real ``SmolLM3ForCausalLM`` built from ``SmolLM3Config`` with random
weights: the same decoder-layer class, GQA, SwiGLU, tied embeddings and NoPE layers as SmolLM3-3B,
small enough to train on two CPU processes in seconds. Used by every chapter.

    python -c "from smolfsdp.models.modeling import *; t = load_tokenizer('tiny'); print(build_model('tiny', t))"
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from smolfsdp.config import ConfigError, nearest
from smolfsdp.data.files import bundled_tokenizer_path

SMOLLM3_3B = "HuggingFaceTB/SmolLM3-3B"

#: Geometry of the tiny preset. Layers are a multiple of 4 so layer 3 is a NoPE layer
#: (SmolLM3Config.no_rope_layer_interval = 4), heads 4 with 2 KV heads keep GQA.
TINY_GEOMETRY: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "no_rope_layer_interval": 4,
}

PRESETS = ("tiny",)


def check_model_name(model: str) -> str:
    """A preset name, a local path or an ``owner/name`` hub id; anything else is an unknown preset."""
    from pathlib import Path

    if model in PRESETS or "/" in model or Path(model).expanduser().exists():
        return model
    hint = nearest(model, PRESETS)
    raise ConfigError(
        f"Unknown model preset {model!r}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f"; presets are {list(PRESETS)}, or give a hub id like {SMOLLM3_3B!r} or a local path."
    )


def load_tokenizer(model: str = "tiny", tokenizer: str | None = None, trust_remote_code: bool = False):
    """The tokenizer for ``model``: the bundled byte-level BPE for ``tiny``, else the model's own.

    Raises ConfigError if the tokenizer cannot be found (offline hub ids included).
    """
    from transformers import AutoTokenizer

    check_model_name(model)
    source = tokenizer or (str(bundled_tokenizer_path()) if model == "tiny" else model)
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"Could not load a tokenizer from {source!r} ({type(err).__name__}: {str(err).splitlines()[0]}). "
            "Give a local directory with tokenizer files, or a hub id on a machine with network access."
        ) from err
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_config(tokenizer, **overrides: Any):
    """A ``SmolLM3Config`` for the tiny preset whose vocabulary and special-token ids fit ``tokenizer``."""
    from transformers import SmolLM3Config

    geometry = {**TINY_GEOMETRY, **overrides}
    if geometry["num_hidden_layers"] % geometry["no_rope_layer_interval"]:
        raise ConfigError(
            "The tiny preset needs num_hidden_layers to be a multiple of 4 so a NoPE layer exists."
        )
    vocab = geometry.pop("vocab_size", len(tokenizer))
    if vocab < len(tokenizer):
        raise ConfigError(f"vocab_size={vocab} is smaller than the tokenizer's {len(tokenizer)} tokens.")
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    for key, value in ids.items():
        if value is None or not 0 <= value < vocab:
            raise ConfigError(
                f"{key}={value} is outside the tokenizer's vocabulary of {vocab}; fix the tokenizer."
            )
    return SmolLM3Config(vocab_size=vocab, **ids, **geometry)


def build_model(
    model: str,
    tokenizer,
    *,
    seed: int = 0,
    trust_remote_code: bool = False,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    **tiny_overrides: Any,
) -> nn.Module:
    """The causal LM for ``model`` (``"tiny"``, a hub id or a local path), in train mode.

    ``tiny_overrides`` change the tiny preset's geometry (e.g. ``vocab_size=1025``).

    ``tiny`` is built from config with weights drawn from ``torch.manual_seed(seed)``, so every rank
    builds the same model. Others load with ``from_pretrained``.
    """
    from transformers import AutoModelForCausalLM, SmolLM3ForCausalLM

    if model == "tiny":
        torch.manual_seed(seed)
        with torch.device(device):
            net = SmolLM3ForCausalLM(tiny_config(tokenizer, **tiny_overrides))
        if dtype is not None:
            net = net.to(dtype)
    else:
        try:
            net = AutoModelForCausalLM.from_pretrained(
                model, dtype=dtype or torch.float32, trust_remote_code=trust_remote_code, device_map=None
            )
        except OSError as err:
            raise ConfigError(f"Could not load model {model!r}: {str(err).splitlines()[0]}") from err
        net.to(device)
    net.train()
    return net


def build_meta_model(model: str, tokenizer=None, trust_remote_code: bool = False) -> nn.Module:
    """The model's module tree on the meta device (no weights, no memory): for checks before launch."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if model == "tiny":
        config = tiny_config(tokenizer)
    else:
        try:
            config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as err:
            if "/" not in model and not model.startswith((".", "/")):
                raise ConfigError(
                    f"Unknown model preset {model!r}; presets are {PRESETS}, or give a hub id "
                    "or a local path."
                ) from err
            raise ConfigError(
                f"Could not read the config of {model!r}: {str(err).splitlines()[0]}. Give a local "
                "path with config.json when offline."
            ) from err
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


# ---------------------------------------------------------------------------- wrap class
def normalise_wrap_class_name(name: str) -> str:
    """Check a wrap-class name given by a user: one class name, no stray spaces or commas."""
    text = str(name)
    cleaned = text.strip().strip(",").strip()
    if not cleaned:
        raise ConfigError(
            "wrap_class is empty; leave it unset to use the model's decoder layer, or give one "
            "class name such as 'SmolLM3DecoderLayer'."
        )
    if cleaned != text or "," in cleaned or " " in cleaned:
        parts = [p.strip() for p in cleaned.split(",") if p.strip()]
        raise ConfigError(
            f"wrap_class={text!r} has stray spaces or commas; give exactly one class name, e.g. {parts[0]!r}."
        )
    return cleaned


def module_class_names(model: nn.Module) -> set[str]:
    return {type(m).__name__ for m in model.modules()}


def discover_wrap_class(model: nn.Module) -> str:
    """The decoder-layer class FSDP should wrap, from ``model._no_split_modules``.

    Raises ConfigError if the model declares none that it contains.
    """
    present = module_class_names(model)
    declared = list(getattr(model, "_no_split_modules", None) or [])
    for name in declared:
        if name in present:
            return name
    raise ConfigError(
        f"{type(model).__name__} declares no decoder-layer class in _no_split_modules "
        f"({declared}); set wrap_class to one of its module classes."
    )


def resolve_wrap_class(model: nn.Module, name: str | None = None) -> type[nn.Module]:
    """The module class to wrap: ``name`` checked against the model, or the discovered one.

    Raises ConfigError naming the closest class in the model (case-insensitive) when ``name`` is not
    one of its module classes.
    """
    name = discover_wrap_class(model) if name is None else normalise_wrap_class_name(name)
    classes = {type(m).__name__: type(m) for m in model.modules()}
    if name in classes:
        return classes[name]
    right = [c for c in classes if c.lower() == name.lower()] or nearest(name, classes)
    hint = f" Did you mean {right[0]!r}?" if right else ""
    raise ConfigError(
        f"wrap_class={name!r} is not a module class of {type(model).__name__}.{hint} "
        f"Its decoder layer is {discover_wrap_class(model)!r}."
    )


def decoder_layers(model: nn.Module, wrap_cls: type[nn.Module]) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, wrap_cls)]


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Parameters of ``model``, shared (tied) tensors counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total
