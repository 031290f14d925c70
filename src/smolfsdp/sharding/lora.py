"""LoRA adapters (peft) on SmolLM3, trained with FSDP2 (or FSDP1 with ``use_orig_params=True``).

The base model is frozen; only the low-rank adapters of q/k/v/o train. FSDP2 shards frozen and
trainable parameters alike, per parameter (``DTensor``, ``Shard(0)``), so a decoder layer can mix
them; FSDP1 can only when it keeps the original parameters (``use_orig_params=True``). The loop is
the native engine's (``smolfsdp.train.native``); this module adds the adapters and their export.

    smolfsdp train --lora                        # 2 CPU processes, tiny SmolLM3, FSDP2
    smolfsdp train --lora --fsdp_version 1       # the same adapters under FSDP1
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.models.modeling import build_meta_model, build_model, discover_wrap_class
from smolfsdp.paths import umask_modes
from smolfsdp.sharding.distributed import parameter_bytes, rank0_writes

ADAPTER_DIR = "adapter"


def lora_config(cfg: TrainConfig):
    """peft ``LoraConfig`` from the run config (defaults r=8, alpha=16, dropout 0.05, q/k/v/o)."""
    from peft import LoraConfig  # deferred: peft is needed by LoRA runs only

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )


def linear_module_names(model: nn.Module) -> list[str]:
    """Distinct short names of the model's ``nn.Linear`` layers (what ``target_modules`` can name)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})


def apply_lora(model: nn.Module, cfg: TrainConfig):
    """Freeze ``model`` and add LoRA adapters; returns the ``PeftModel``.

    ``get_peft_model`` sets ``requires_grad=False`` on every base parameter and wraps each target
    ``nn.Linear`` in a LoRA layer that keeps the frozen weight and adds the trainable ``lora_A`` (r x in)
    and ``lora_B`` (out x r), in fp32 (peft's ``autocast_adapter_dtype``). Raises ConfigError when a target
    module matches no linear layer (:func:`check_target_modules`) or an FSDP group would mix trainable
    dtypes (:func:`check_trainable_dtypes`).
    """
    from peft import get_peft_model  # deferred: peft is needed by LoRA runs only

    check_target_modules(model, cfg.lora_target_modules)
    peft_model = get_peft_model(model, lora_config(cfg))
    check_trainable_dtypes(peft_model)
    return peft_model


def check_target_modules(model: nn.Module, targets) -> None:
    """Raise ConfigError naming the LoRA ``targets`` that match no ``nn.Linear`` of ``model``, and listing those
    that exist (:func:`linear_module_names`)."""
    names = linear_module_names(model)
    missing = [t for t in targets if t not in names]
    if missing:
        raise ConfigError(
            f"lora_target_modules {missing} match no linear layer of {type(model).__name__}; "
            f"its linear layers are {names}."
        )


def check_trainable_dtypes(model: nn.Module, wrap_cls: type[nn.Module] | None = None) -> None:
    """FSDP reduces the gradients of one group in one dtype: trainable parameters of a group (a
    decoder layer, or the root) must share a dtype. Raises ConfigError naming them otherwise."""
    wrap_name = wrap_cls.__name__ if wrap_cls else discover_wrap_class(model)
    groups: dict[str, dict[str, list[str]]] = {}
    layer_prefixes = [n for n, m in model.named_modules() if type(m).__name__ == wrap_name]
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        group = next((pre for pre in layer_prefixes if name.startswith(pre + ".")), "<root>")
        groups.setdefault(group, {}).setdefault(str(p.dtype).replace("torch.", ""), []).append(name)
    for group, by_dtype in groups.items():
        if len(by_dtype) > 1:
            detail = "; ".join(f"{d}: {names[:3]}" for d, names in by_dtype.items())
            raise ConfigError(
                f"FSDP group {group} mixes trainable dtypes ({detail}). Cast the adapters to one "
                "dtype (e.g. model.to(torch.float32) before sharding) so the group reduces in one."
            )


def save_adapter(model: nn.Module, out_dir: Path, info, cfg: TrainConfig, tokenizer) -> dict[str, Any]:
    """Gather the full adapter tensors from all ranks and save them in PEFT format on rank 0.

    Collective (every rank calls it); only the adapters are gathered (:func:`gather_adapter`). The
    files load with ``PeftModel.from_pretrained`` in one plain process. With ``cfg.lora_merge`` the
    base model with the adapter merged in is saved too (``merged/``): the other ranks wait for that
    write in a barrier sized to the model's bytes (``rank0_writes``). Returns ``{"adapter": path,
    "merged": path | None, "tensors": n}``.
    """
    # a merged model is the whole model's bytes; the adapter alone is megabytes
    nbytes = parameter_bytes(model, info.device) if cfg.lora_merge else 0
    result: dict[str, Any] = {"adapter": str(out_dir / ADAPTER_DIR), "merged": None}
    with rank0_writes(nbytes):
        adapter = gather_adapter(model, info)
        if info.is_main:
            result["tensors"] = len(adapter)
            result["merged"] = _write_adapter(adapter, out_dir, cfg, tokenizer)
    return result


def _write_adapter(
    adapter: dict[str, torch.Tensor], out_dir: Path, cfg: TrainConfig, tokenizer
) -> str | None:
    """Rank 0: the adapter in PEFT format, and with ``cfg.lora_merge`` the merged model; returns its path."""
    from peft import get_peft_model  # deferred: peft is needed by LoRA runs only
    from peft.utils.constants import EMBEDDING_LAYER_NAMES  # deferred: peft is needed by LoRA runs only

    # peft 0.21 picks adapter entries by walking the model's module names; under FSDP1 those carry
    # "_fsdp_wrapped_module." while the gathered keys are clean, so it would find none. A skeleton
    # PeftModel on the meta device has the clean names and costs no memory.
    skeleton = get_peft_model(build_meta_model(cfg.model, tokenizer, cfg.trust_remote_code), lora_config(cfg))
    skeleton.peft_config["default"].base_model_name_or_path = cfg.model  # what to load it onto
    # save_embedding_layers given: with "auto" peft 0.21 looks cfg.model ("tiny") up on the Hub
    # and warns twice when it cannot; the adapter holds embeddings only if they are LoRA targets.
    embeddings = bool(set(cfg.lora_target_modules) & set(EMBEDDING_LAYER_NAMES))
    skeleton.save_pretrained(
        out_dir / ADAPTER_DIR, state_dict=adapter, safe_serialization=True, save_embedding_layers=embeddings
    )
    tokenizer.save_pretrained(out_dir / ADAPTER_DIR)
    umask_modes(out_dir / ADAPTER_DIR)  # safetensors writes 0600
    if not cfg.lora_merge:
        return None
    merged = load_adapter_model(cfg.model, out_dir / ADAPTER_DIR, tokenizer, seed=cfg.seed).merge_and_unload()
    merged.save_pretrained(out_dir / "merged", safe_serialization=True)
    tokenizer.save_pretrained(out_dir / "merged")
    umask_modes(out_dir / "merged")
    return str(out_dir / "merged")


def gather_adapter(model: nn.Module, info) -> dict[str, torch.Tensor]:
    """The full LoRA tensors (names holding ``.lora_``) on rank 0, in host memory; ``{}`` elsewhere.

    Collective. FSDP2: each adapter ``DTensor`` of the sharded state dict is gathered alone
    (``full_tensor()``, in the same key order on every rank): megabytes, never the frozen base (12 GB
    in fp32 for SmolLM3-3B, which a full state dict would gather first only to be dropped). FSDP1
    flattens frozen and adapter parameters of a unit into one ``FlatParameter``, so its adapters
    cannot be gathered without their unit: there the full state dict is gathered (offloaded to host
    memory on a GPU) and filtered.
    """
    from torch.distributed.tensor import DTensor  # deferred: only the export needs it

    if isinstance(model, FSDP) or FSDP.fsdp_modules(model):
        offload = info.device.type == "cuda"  # see smolfsdp.train.export.save_final_model for why not on CPU
        opts = StateDictOptions(full_state_dict=True, cpu_offload=offload)
        full = get_model_state_dict(model, options=opts)
        return {k: v.detach().cpu().clone() for k, v in full.items() if ".lora_" in k} if info.is_main else {}
    sharded = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    adapter = {}
    for key in sorted(k for k in sharded if ".lora_" in k):  # one order on every rank: collectives pair up
        value = sharded[key]
        value = value.full_tensor() if isinstance(value, DTensor) else value
        if info.is_main:
            adapter[key] = value.detach().cpu().clone()
    return adapter


def load_adapter_model(base_model: str, adapter_dir: str | Path, tokenizer, seed: int = 0):
    """Base model + saved adapter in one process (no distributed set-up), in eval mode."""
    from peft import PeftModel  # deferred: peft is needed by LoRA runs only

    base = build_model(base_model, tokenizer, seed=seed)
    return PeftModel.from_pretrained(base, str(adapter_dir)).eval()


def generate(model: nn.Module, **kwargs):
    """``generate`` on a sharded model (FSDP1 or FSDP2, LoRA or not); returns the token ids tensor
    ``(batch, prompt + new tokens)``, as ``GenerationMixin.generate`` does. Collective: every rank calls it.

    FSDP2: ``apply_fsdp2`` registers a peft model's ``generate`` with FSDP, so this is
    ``model.generate(**kwargs)`` with ``synced_gpus=True`` (ranks keep stepping together even when one
    rank's rows end early; each forward gathers layers on all ranks). FSDP1: ``model.generate`` reaches
    the inner model past the root's hooks and fails on the sharded embedding ("'weight' must be 2-D"), so
    the parameters are gathered whole on every rank (``FSDP.summon_full_params``, ``writeback=False``) and
    each rank generates on its own: it needs the full model's memory on each rank for the call.
    """
    if isinstance(model, FSDP):
        with torch.no_grad(), FSDP.summon_full_params(model, writeback=False):
            return model.module.generate(**kwargs)
    kwargs.setdefault("synced_gpus", dist.is_initialized() and dist.get_world_size() > 1)
    with torch.no_grad():
        return model.generate(**kwargs)
