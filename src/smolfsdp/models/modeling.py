"""Tokenizer and model: the SmolLM3-3B checkpoint, a local path, or the ``tiny`` preset.

The ``tiny`` preset is a real ``SmolLM3ForCausalLM`` built from ``SmolLM3Config`` with random
weights: the same decoder-layer class, GQA, SwiGLU, tied embeddings and NoPE layers as SmolLM3-3B,
small enough to train on two CPU processes in seconds. Used by every chapter.

    python -c "from smolfsdp.models.modeling import *; t = load_tokenizer('tiny'); print(build_model('tiny', t))"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smolfsdp.errors import ConfigError, did_you_mean
from smolfsdp.paths import bundled_tokenizer_path, check_model_folder

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
    """A preset name, a local path or an ``owner/name`` hub id; anything else is an unknown preset, and a name
    that looks like a path (:func:`smolfsdp.paths.looks_like_path`) must be an existing folder."""
    check_model_folder(model)
    if model in PRESETS or "/" in model or Path(model).expanduser().exists():
        return model
    raise ConfigError(
        f"Unknown model preset {model!r}"
        + did_you_mean(model, PRESETS, form=" (did you mean {}?)")
        + f"; presets are {list(PRESETS)}, or give a hub id like {SMOLLM3_3B!r} or a local path."
    )


#: Files of a model folder whose ``auto_map`` makes transformers import the folder's own Python.
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json")


#: The option that turns ``trust_remote_code`` on for ``smolfsdp train``, ``bench`` and ``dryrun`` (a TrainConfig
#: field: ``--trust_remote_code true``, or ``trust_remote_code: true`` in the run config). ``smolfsdp convert``'s
#: is a bare flag, ``--trust_remote_code``; ``smolfsdp memory`` has none (it never runs a model's code).
TRUST_OPTION = "--trust_remote_code true"


def remote_code_fix(option: str | None = TRUST_OPTION) -> str:
    """The advice after a refused ``auto_map``: pass ``option`` (the calling command's own) only after reading
    the code; ``option=None`` for ``smolfsdp memory``, which has no such option."""
    if option is None:
        return (
            "smolfsdp memory has no such option: it never runs a model's own code; give a folder whose "
            "config.json names a transformers architecture without auto_map"
        )
    return f"pass {option} only after reading that code, or give a folder without auto_map"


def refuse_remote_code(model, trust_remote_code: bool = False, *, option: str | None = TRUST_OPTION) -> None:
    """Raise ConfigError when the local folder ``model`` names its own Python (``auto_map`` in
    config.json or tokenizer_config.json) and ``trust_remote_code`` is off: before transformers asks
    on standard input or imports the folder's ``.py`` files. Hub ids and presets pass (transformers
    itself refuses their code with ``trust_remote_code=False``, which every caller passes). ``option``: the
    calling command's way to turn it on, named in the advice (:func:`remote_code_fix`)."""
    if trust_remote_code or not isinstance(model, (str, Path)):
        return
    folder = Path(str(model)).expanduser()
    if not folder.is_dir():
        return
    for name in REMOTE_CODE_FILES:
        try:
            auto_map = json.loads((folder / name).read_text()).get("auto_map")
        except (OSError, ValueError, AttributeError):
            continue
        if auto_map:
            raise ConfigError(
                f"{folder / name} has auto_map (the folder's own Python: {sorted(auto_map)}); refused: "
                f"{remote_code_fix(option)}."
            )


def load_tokenizer(model: str = "tiny", tokenizer: str | None = None, trust_remote_code: bool = False):
    """The tokenizer for ``model``: the bundled byte-level BPE for ``tiny``, else the model's own.

    Raises ConfigError if the tokenizer cannot be found (offline hub ids included).
    """
    from transformers import (
        AutoTokenizer,  # deferred: transformers takes seconds to import; `smolfsdp memory` and the launcher need none
    )

    check_model_name(model)
    source = tokenizer or (str(bundled_tokenizer_path()) if model == "tiny" else model)
    refuse_remote_code(source, trust_remote_code)
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
    from transformers import (
        SmolLM3Config,  # deferred: transformers takes seconds to import; `smolfsdp memory` and the launcher need none
    )

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
    attn_implementation: str | None = None,
    **tiny_overrides: Any,
) -> nn.Module:
    """The causal LM for ``model`` (``"tiny"``, a hub id or a local path), in train mode.

    ``tiny_overrides`` change the tiny preset's geometry (e.g. ``vocab_size=1025``). ``attn_implementation``
    (``sdpa``, ``eager``, ``flash_attention_2``, a hub kernel ...; None: transformers' default, SDPA where the model
    supports it) is handed to transformers, which checks it against the model and may adjust it: the one that ran
    is ``model.config._attn_implementation``.

    ``tiny`` is built from config with weights drawn from ``torch.manual_seed(seed)``, so every rank
    builds the same model. Others load with ``from_pretrained``.
    """
    from transformers import (  # deferred: transformers takes seconds to import; `smolfsdp memory` and the launcher need none
        AutoModelForCausalLM,
        SmolLM3ForCausalLM,
    )

    if model == "tiny":
        torch.manual_seed(seed)
        config = tiny_config(tokenizer, **tiny_overrides)
        config._attn_implementation = (
            attn_implementation  # checked by the model's __init__, as from_pretrained does
        )
        with torch.device(device):
            net = SmolLM3ForCausalLM(config)
        if dtype is not None:
            net = net.to(dtype)
    else:
        refuse_remote_code(model, trust_remote_code)
        try:
            net = AutoModelForCausalLM.from_pretrained(
                model,
                dtype=dtype or torch.float32,
                trust_remote_code=trust_remote_code,
                device_map=None,
                attn_implementation=attn_implementation,
            )
        except OSError as err:
            raise ConfigError(f"Could not load model {model!r}: {str(err).splitlines()[0]}") from err
        net.to(device)
    net.train()
    return net


def build_meta_model(model: str, tokenizer=None, trust_remote_code: bool = False) -> nn.Module:
    """The model's module tree on the meta device (no weights, no memory): for checks before launch."""
    from transformers import (  # deferred: transformers takes seconds to import; `smolfsdp memory` and the launcher need none
        AutoConfig,
        AutoModelForCausalLM,
    )

    if model == "tiny":
        config = tiny_config(tokenizer)
    else:
        refuse_remote_code(model, trust_remote_code)
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


# ---------------------------------------------------------------------------- local model folders
#: Bytes per element of each safetensors dtype (the format's own names; safetensors/src/tensor.rs).
SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
#: A header longer than this is not a model's (SmolLM3-3B's is ~40 KB); safetensors itself caps it at 100 MB.
MAX_HEADER_BYTES = 100 * 2**20


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a ``.safetensors`` file, checked against the file: its length fits the file, each
    tensor's ``data_offsets`` lie inside the data and span ``numel x dtype`` bytes. Reads the header only.

    Raises:
        ConfigError: naming the file, the tensor and what is wrong, and the fix.
    """
    size = path.stat().st_size
    fix = "the file is damaged or was edited: download or save the model again."
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(size - 8, MAX_HEADER_BYTES):
            raise ConfigError(
                f"{path}: its header length ({n:,} bytes) does not fit the file ({size:,} bytes); {fix}"
            )
        try:
            header = json.loads(f.read(n))
        except ValueError as err:
            raise ConfigError(f"{path}: its header is not JSON ({err}); {fix}") from err
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape, (start, end) = [int(d) for d in info["shape"]], info["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            want = numel * SAFETENSORS_DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{path}: the header entry of {name!r} is malformed ({err!r}); {fix}") from err
        if not (
            isinstance(start, int)
            and isinstance(end, int)
            and 0 <= start <= end <= data
            and end - start == want
        ):
            raise ConfigError(
                f"{path}: {name!r} ({info['dtype']} {shape}) needs {want:,} bytes but its header points at bytes "
                f"{start}..{end} of {data:,}; {fix}"
            )
    return header


def check_safetensors_folder(model: str, meta_model: nn.Module) -> None:
    """For a local model folder: every ``.safetensors`` header is sound (:func:`read_safetensors_header`) and
    each tensor's shape is the one the folder's ``config.json`` builds (``meta_model``, on the meta
    device). Header reads only: milliseconds, before any process loads the weights.

    Raises:
        ConfigError: naming the file, the tensor, both shapes and the fix.
    """
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return  # a preset or a hub id: nothing local to read
    expected = {k: tuple(v.shape) for k, v in meta_model.state_dict().items()}
    for path in sorted(folder.glob("*.safetensors")):
        for name, info in read_safetensors_header(path).items():
            if name != "__metadata__" and name in expected and tuple(info["shape"]) != expected[name]:
                raise ConfigError(
                    f"{path}: {name!r} has shape {list(info['shape'])} but {folder / 'config.json'} builds "
                    f"{list(expected[name])}; the weights and the config are of different models. Use the "
                    "config.json that came with these weights."
                )


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
    right = [c for c in classes if c.lower() == name.lower()]
    hint = did_you_mean(name, classes, hits=right[:1] or None)
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
