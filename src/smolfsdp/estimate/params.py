"""Exact parameter counts of a model config, grouped as FSDP wraps them (no weights, no model built).

SmolLM3 and Llama configs are counted from the config's numbers (:func:`_analytic_units`: the shapes
``modeling_smollm3`` / ``modeling_llama`` give each ``nn.Linear`` and norm, in ``named_parameters`` order), which
keeps ``smolfsdp memory`` fast; any other architecture is built on the meta device and walked.
tests/test_params_analytic.py holds the two ways equal on the shipped, tiny and Llama configs, with and without LoRA.

Chapters "Where the memory goes" and "Scaling out" (``notebooks/00_memory.ipynb``,
``notebooks/07_scaling.ipynb``) count with these; ``smolfsdp.estimate.layout`` pads the groups per rank
and ``smolfsdp.estimate.memory`` turns them into bytes.

    python -c "from smolfsdp.estimate.params import *; print(count_parameters(resolve_model_config('smollm3-3b')))"
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from smolfsdp.errors import ConfigError, nearest
from smolfsdp.models.modeling import load_tokenizer, refuse_remote_code, tiny_config
from smolfsdp.paths import check_model_folder, repo_root

SHIPPED_MODELS = {
    "smollm3-3b": "data/models/smollm3_3b",
    "HuggingFaceTB/SmolLM3-3B": "data/models/smollm3_3b",
}


@dataclass(frozen=True)
class LoraSpec:
    """peft ``LoraConfig(r, lora_alpha, target_modules)``: adapters ``A (r x in)`` and ``B (out x r)``."""

    r: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    dropout: float = 0.0  # lora_dropout: > 0 saves each adapter's dropped input and its mask for backward


@dataclass(frozen=True)
class ParamSpec:
    name: str
    numel: int
    dim0: int
    trainable: bool


@dataclass(frozen=True)
class ParamCounts:
    total: int
    trainable: int
    embedding: int
    per_layer: int
    n_layers: int
    largest_unit: int
    largest_unit_name: str


def resolve_model_config(model, local_files_only: bool | None = None, trust_remote_code: bool = False):
    """A ``PretrainedConfig`` from ``"smollm3-3b"`` (shipped), ``"tiny"``, a directory or a hub id.

    Raises ConfigError when a hub id cannot be resolved (offline): the config is needed, not weights;
    and when the folder or hub repo names its own Python (``auto_map``) and ``trust_remote_code`` is off
    (:func:`smolfsdp.models.modeling.refuse_remote_code`): its code is never run or asked about.
    """
    config = _resolve(model, local_files_only, trust_remote_code)
    check_model_size(config)
    return config


#: Most decoder layers a config may ask for: the largest open models have ~126 (Llama-3.1-405B); a
#: meta-device build holds a Python module per layer, so 10**6 layers exhaust host memory before any check.
MAX_LAYERS = 2048


def check_model_size(config) -> None:
    """Raise ConfigError when ``config`` asks for more than ``MAX_LAYERS`` layers or a non-positive
    geometry: checked from the numbers alone, before any module is built."""
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and not 1 <= layers <= MAX_LAYERS:
        raise ConfigError(
            f"num_hidden_layers={layers:,} in the model's config is outside 1..{MAX_LAYERS:,} (the largest "
            "open models have ~126); fix config.json."
        )
    for key in ("hidden_size", "intermediate_size", "vocab_size"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not 1 <= value <= 2**20 * (8 if key == "vocab_size" else 1):
            raise ConfigError(
                f"{key}={value:,} in the model's config is not a plausible size; fix config.json."
            )


def _resolve(model, local_files_only, trust_remote_code):
    if isinstance(model, PretrainedConfig):
        return model
    if model == "tiny":
        return tiny_config(load_tokenizer("tiny"))
    if model in SHIPPED_MODELS:
        return AutoConfig.from_pretrained(repo_root() / SHIPPED_MODELS[model], trust_remote_code=False)
    path = Path(str(model)).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} has no config.json; give a directory with the model's config.json.")
        refuse_remote_code(path, trust_remote_code)
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    check_model_folder(model)  # ../models/x missing is a missing folder, not a hub id to download
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
        config = AutoConfig.from_pretrained(
            model, local_files_only=local_files_only, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        if "trust_remote_code" in str(err):
            raise ConfigError(
                f"{model!r} names its own Python (auto_map); refused: pass --trust_remote_code true only "
                "after reading that code."
            ) from err
        raise ConfigError(
            f"Could not resolve {model!r} offline: the estimate needs only its config.json (no weights). "
            f"Download it where there is network (huggingface-cli download {model} config.json "
            "--local-dir DIR) and pass --model DIR."
        ) from err
    return config


def llama3_70b_config():
    """A Llama-3-70B geometry as a ``LlamaConfig`` (values of meta-llama/Meta-Llama-3-70B config.json:
    hidden 8192, 80 layers, 64 heads, 8 KV heads, MLP 28672, vocab 128256, untied embeddings). No
    download; meta-device counting gives 70,553,706,496 parameters."""
    from transformers import LlamaConfig  # deferred: its modeling imports are not needed to count

    return LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip


def llama3_8b_config():
    """A Llama-3-8B geometry as a ``LlamaConfig`` (meta-llama/Meta-Llama-3-8B config.json: hidden 4096,
    32 layers, 32 heads, 8 KV heads, MLP 14336, vocab 128256, untied): 8.03 B parameters, 16.1 GB in
    bf16, the "16 GB model" of seed 2. No download."""
    from transformers import LlamaConfig  # deferred: its modeling imports are not needed to count

    return LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip


def _param_specs(module, prefix: str, skip: list[str], lora: LoraSpec | None, seen: set[int]):
    """``module``'s parameters outside ``skip`` (each once: tied weights are seen once), LoRA adapters
    after each target's weight."""
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


#: Architectures counted from the config alone: ``model_type`` -> the decoder layer class FSDP wraps
ANALYTIC_LAYERS = {"smollm3": "SmolLM3DecoderLayer", "llama": "LlamaDecoderLayer"}


def _linear(
    name: str, n_in: int, n_out: int, bias: bool, lora: LoraSpec | None, frozen: bool
) -> list[ParamSpec]:
    """An ``nn.Linear(n_in, n_out, bias)``'s parameters as :func:`_param_specs` lists them: the weight
    ``(n_out x n_in)``, peft's ``lora_A (r x n_in)`` and ``lora_B (n_out x r)`` when targeted, then the bias."""
    out = [ParamSpec(f"{name}.weight", n_out * n_in, n_out, not frozen)]
    if lora and name.rsplit(".", 1)[-1] in lora.targets:
        out += [ParamSpec(f"{name}.lora_A", lora.r * n_in, lora.r, True)]
        out += [ParamSpec(f"{name}.lora_B", n_out * lora.r, n_out, True)]
    if bias:
        out.append(ParamSpec(f"{name}.bias", n_out, n_out, not frozen))
    return out


def _analytic_units(config, lora: LoraSpec | None):
    """:func:`_units_cached`'s answer for a SmolLM3 or Llama config, from its numbers: per decoder layer the
    attention's q/k/v/o (``num_attention_heads`` and ``num_key_value_heads`` x ``head_dim``), the MLP's
    gate/up/down, two RMSNorm weights; the root the embedding, the final norm and, untied, ``lm_head``;
    buffers the rotary ``inv_freq`` and ``original_inv_freq`` (fp32, ``head_dim / 2`` each)."""
    h, inter, frozen = config.hidden_size, config.intermediate_size, lora is not None
    q = getattr(config, "head_dim", None) or h // config.num_attention_heads
    heads, kv = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    attn_bias, mlp_bias = bool(config.attention_bias), bool(getattr(config, "mlp_bias", False))
    units = {}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes = [
            ("self_attn.q_proj", h, heads * q, attn_bias), ("self_attn.k_proj", h, kv * q, attn_bias),
            ("self_attn.v_proj", h, kv * q, attn_bias), ("self_attn.o_proj", heads * q, h, attn_bias),
            ("mlp.gate_proj", h, inter, mlp_bias), ("mlp.up_proj", h, inter, mlp_bias),
            ("mlp.down_proj", inter, h, mlp_bias),
        ]  # fmt: skip
        specs = [
            s for name, n_in, n_out, b in shapes for s in _linear(f"{p}.{name}", n_in, n_out, b, lora, frozen)
        ]
        norms = [
            ParamSpec(f"{p}.{n}.weight", h, h, not frozen)
            for n in ("input_layernorm", "post_attention_layernorm")
        ]
        units[p] = specs + norms
    root = [
        ParamSpec("model.embed_tokens.weight", config.vocab_size * h, config.vocab_size, not frozen),
        ParamSpec("model.norm.weight", h, h, not frozen),
    ]
    if not config.tie_word_embeddings:  # tied: lm_head is embed_tokens, seen once
        root.append(ParamSpec("lm_head.weight", config.vocab_size * h, config.vocab_size, not frozen))
    rotary = len(range(0, int(q * getattr(config, "partial_rotary_factor", 1.0)), 2))
    return {"root": root, **units}, ANALYTIC_LAYERS[config.model_type], 2 * rotary * 4


@functools.lru_cache(maxsize=16)
def _units_cached(config_json: str, model_type: str, lora: LoraSpec | None):
    kwargs = {k: v for k, v in json.loads(config_json).items() if k != "model_type"}
    config = AutoConfig.for_model(model_type, **kwargs)
    if model_type in ANALYTIC_LAYERS:
        return _analytic_units(config, lora)
    return _meta_units(config, lora)


def _meta_units(config, lora: LoraSpec | None):
    """Any architecture: the model built on the meta device (no memory), its decoder layers found by
    ``_no_split_modules``, each parameter listed once (tied weights) with LoRA adapters after each target."""
    import torch  # deferred: only an architecture not counted analytically is built
    from transformers import AutoModelForCausalLM  # deferred: imports the modeling code

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(config)
    wrap = next(n for n in net._no_split_modules if any(type(m).__name__ == n for m in net.modules()))
    layers = [(n, m) for n, m in net.named_modules() if type(m).__name__ == wrap]
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    seen: set[int] = set()
    units = {name: _param_specs(mod, name, [], lora, seen) for name, mod in layers}
    root = _param_specs(net, "", [n for n, _ in layers], lora, seen)
    return {"root": root, **units}, wrap, buffers


def model_units(config, lora: LoraSpec | None = None) -> dict[str, list[ParamSpec]]:
    """Parameters grouped as FSDP wraps them: ``"root"`` (embedding, final norm) then one unit per
    decoder layer, each in ``named_parameters`` order, with peft's LoRA adapters after each target."""
    return _units_cached(config.to_json_string(use_diff=False), config.model_type, lora)[0]


def buffer_bytes(config) -> int:
    """Bytes of the model's buffers (rotary ``inv_freq`` and the like) as built from ``config``."""
    return _units_cached(config.to_json_string(use_diff=False), config.model_type, None)[2]


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
