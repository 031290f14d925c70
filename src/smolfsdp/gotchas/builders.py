"""What the gotcha cases share: a tiny SmolLM3, a batch per rank, FSDP2 sharding on a CPU mesh.

Used by ``smolfsdp.gotchas.cases_distributed`` and ``smolfsdp.gotchas.cases_local`` (chapter
"Debugging the seams"); kept apart from ``smolfsdp.gotchas.registry`` so that the catalogue (and
``smolfsdp gotchas --list``) loads without torch.

    python -c "from smolfsdp.gotchas.builders import tiny_model; print(tiny_model()[0])"
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.smollm3.modeling_smollm3 import SmolLM3DecoderLayer

from smolfsdp.models.modeling import build_model, load_tokenizer
from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh


def tiny_model(seed: int = 0, **kw):
    """The tiny SmolLM3 (``modeling.build_model("tiny")``) and its tokenizer."""
    tok = load_tokenizer("tiny")
    return build_model("tiny", tok, seed=seed, **kw), tok


def rank_batch(rank: int) -> dict[str, torch.Tensor]:
    """Two random sequences of 24 tokens, different per rank, labels = inputs."""
    ids = torch.randint(3, 500, (2, 24), generator=torch.Generator().manual_seed(100 + rank))
    return {"input_ids": ids, "labels": ids.clone()}


def decoder_layer_cls():
    return SmolLM3DecoderLayer


def shard_fsdp2(model: nn.Module, world: int) -> nn.Module:
    """``apply_fsdp2`` on a CPU mesh of ``world`` ranks, one unit per decoder layer."""
    return apply_fsdp2(model, build_mesh("cpu", world), decoder_layer_cls())


def full_tensor(p) -> torch.Tensor:
    """A parameter's full value: a DTensor gathered, a plain tensor detached."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
