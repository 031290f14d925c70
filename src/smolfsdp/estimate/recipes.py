"""Precision recipes (bytes kept per parameter) and the FSDP strategy names the estimates accept.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``) tabulates :data:`RECIPES`;
``smolfsdp.estimate.memory`` and ``smolfsdp.estimate.comm`` read them. Pure data, no GPU.

    python -c "from smolfsdp.estimate.recipes import RECIPES; print(*RECIPES.values(), sep='\\n')"
"""

from __future__ import annotations

from dataclasses import dataclass

from smolfsdp.errors import ConfigError, nearest

GIB = 2**30

STRATEGIES = ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
#: Field names for the same strategies (ZeRO stages, DDP, HSDP), accepted by the communication model.
STRATEGY_ALIASES = {
    "DDP": "NO_SHARD",
    "ZERO2": "SHARD_GRAD_OP",
    "ZERO3": "FULL_SHARD",
    "HSDP": "HYBRID_SHARD",
}


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter that a precision recipe keeps; ``0`` means the copy does not exist."""

    name: str
    param_bytes: int  # the sharded parameter storage
    grad_bytes: int  # the sharded gradient (FSDP reduces into it)
    master_bytes: int  # a separate fp32 master copy of trainable parameters
    state_bytes: int  # each of Adam's m and v
    compute_bytes: int  # gathered units and activations
    what: str

    @property
    def trainable_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.master_bytes + 2 * self.state_bytes


RECIPES = {
    r.name: r
    for r in (
        Recipe("fp32", 4, 4, 0, 4, 4, "fp32 everywhere; torch AdamW keeps m, v in the parameter dtype"),
        Recipe(
            "hf-fsdp-bf16", 4, 4, 0, 4, 2,
            "HF Trainer + FSDP with bf16=True: fp32 sharded params and grads, fp32 AdamW, bf16 compute "
            "(FSDP MixedPrecision casts only the gathered unit)",
        ),
        Recipe("pure-bf16", 2, 2, 0, 2, 2, "model loaded in bf16; AdamW m, v follow the bf16 params"),
        Recipe("seed-table", 2, 2, 0, 4, 2, "the seed's table: bf16 weights and grads, fp32 m and v, no master"),
        Recipe(
            "zero-paper", 2, 2, 4, 4, 2,
            "ZeRO mixed-precision Adam (Rajbhandari et al. 2020, sec. 3.1): 2+2+K, K=12 (fp32 master, m, v)",
        ),
        Recipe(
            "zero-mixed", 2, 4, 4, 4, 2,
            "ZeRO mixed precision with bf16 weights and fp32 gradient accumulation: 2+4+12 = 18 "
            "(Megatron-LM distributed-optimizer docs: 'bf16 param, fp32 grads: 18 bytes')",
        ),
    )
}  # fmt: skip


def check_choice(value: str, options, what: str) -> str:
    """``value`` when it is one of ``options``; else ConfigError naming the nearest option and all of them."""
    if value in options:
        return value
    hint = nearest(value, options)
    raise ConfigError(
        f"Unknown {what} {value!r}"
        + (f"; did you mean {hint[0]!r}?" if hint else "")
        + f" Known: {', '.join(options)}."
    )


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ConfigError (with the nearest name) for an unknown one."""
    return RECIPES[check_choice(name, list(RECIPES), "recipe")]
