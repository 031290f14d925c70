"""The final model of a run, gathered from the shards and saved so one plain process can load it.

``save_final_model`` is the export of both engines (``smolfsdp.train.native`` and
``smolfsdp.train.trl_engine``): the full state dict gathered with ``torch.distributed.checkpoint``,
tied weights saved once, safetensors written to a temporary folder and moved into place when
complete. The result loads with ``AutoModelForCausalLM.from_pretrained(run_dir / "final_model")``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from smolfsdp.paths import umask_modes
from smolfsdp.sharding.distributed import DistInfo, parameter_bytes, rank0_writes


def save_final_model(model: nn.Module, tokenizer, out_dir: Path, info: DistInfo) -> None:
    """Gather the full state dict to rank 0 (a collective) and save it with ``save_pretrained``.

    The other ranks then wait for rank 0's write in a barrier sized to the bytes
    (:func:`smolfsdp.sharding.distributed.rank0_writes`), not in one bounded by the group's 600 s.
    """
    with rank0_writes(parameter_bytes(model, info.device)):
        _gather_and_write(model, tokenizer, out_dir, info)


def _gather_and_write(model: nn.Module, tokenizer, out_dir: Path, info: DistInfo) -> None:
    # cpu_offload=True moves the gathered tensors to host memory on GPU runs; on a CPU-only FSDP1 run
    # (torch 2.13, gloo) it crashes rank 0 with SIGSEGV, and the tensors are on the host already.
    offload = info.device.type == "cuda"
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if info.is_main:
        inner = getattr(model, "module", model)
        # Tied weights (SmolLM3's lm_head = embed_tokens) are saved once, as from_pretrained expects;
        # the gathered state dict holds them under both names.
        for name in tied_duplicates(inner):
            state.pop(name, None)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        inner.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        umask_modes(tmp)  # safetensors writes 0600
        _replace_dir(tmp, out_dir)


def tied_duplicates(model: nn.Module) -> list[str]:
    """Clean names of parameters that are the same tensor as an earlier parameter (tied weights)."""
    seen, dupes = set(), []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            dupes.append(name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", ""))
        seen.add(id(p))
    return dupes


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Move a finished ``tmp`` into place; an existing ``out_dir`` is removed only after that."""
    old = out_dir.with_name(out_dir.name + ".old")
    if out_dir.exists():
        out_dir.replace(old)
    tmp.replace(out_dir)
    shutil.rmtree(old, ignore_errors=True)
