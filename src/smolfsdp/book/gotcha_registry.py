"""The gotcha registry: what a gotcha is, how its two forms are recorded, and the small builders the
cases share (a tiny SmolLM3, a batch per rank, FSDP2 sharding on a CPU mesh).

Used by the chapter "Debugging the seams" through ``smolfsdp.book.gotchas`` (which runs them); the cases
register themselves here from ``smolfsdp.book.gotcha_cases_distributed`` and
``smolfsdp.book.gotcha_cases_local``.

    python -c "from smolfsdp.book import gotchas; print(list(gotchas.GOTCHAS))"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.models.smollm3.modeling_smollm3 import SmolLM3DecoderLayer

from smolfsdp.models.modeling import build_model, load_tokenizer
from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh

DIST, LOCAL, CRASH = "dist", "local", "crash"  # how a gotcha runs: 2 ranks, 1 process, own launch
WRONG = "wrong result"  # outcome of a form that raised nothing but measurably did the wrong thing


@dataclass
class Gotcha:
    name: str
    title: str
    kind: str
    explanation: str
    fn: Any = field(repr=False, default=None)


@dataclass
class GotchaResult:
    name: str
    title: str
    failing: dict[str, Any]
    fixed: dict[str, Any]
    explanation: str
    versions: dict[str, str]
    # the fix a seed (one of the book's source posts) gave, where it differs from ours and was run too
    seed_fix: dict[str, Any] | None = None


GOTCHAS: dict[str, Gotcha] = {}


def gotcha(name: str, title: str, kind: str, explanation: str):
    def register(fn):
        GOTCHAS[name] = Gotcha(name, title, kind, " ".join(explanation.split()), fn)
        return fn

    return register


def attempt(fn, *args, **kwargs) -> dict[str, Any]:
    """Run ``fn``: ``{"outcome": "ok", **measured}`` or ``{"outcome": "error", "error", "message"}``."""
    try:
        measured = fn(*args, **kwargs)
    except Exception as err:  # recorded, not hidden: the failing form is expected to raise
        lines = str(err).strip().splitlines() or [""]
        return {"outcome": "error", "error": type(err).__name__, "message": lines[0]}
    return {"outcome": "ok", **(measured or {})}


KIND_LEGEND = {
    DIST: "runs in 2 processes (torchrun, gloo), both forms in one launch",
    LOCAL: "runs in this process, no process group",
    CRASH: "the failing form kills the process (e.g. SIGSEGV), so each form gets its own launch",
}


# ---------------------------------------------------------------------------------- shared builders
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
