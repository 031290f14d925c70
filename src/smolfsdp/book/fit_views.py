"""Chapter "Where the memory goes", its two fit sections: the verdict table, the "Does FSDP fit?" table and the
sentence under the fit explorer, all from the one verdict (``smolfsdp.estimate.hardware.fit_verdict``).

    python -c "from smolfsdp.book import fit_views as f; from smolfsdp.estimate.memory import estimate_memory as e; \
print(f.fit_words({'FULL_SHARD x2': e(world_size=2, seq_len=4096)}))"
"""

from __future__ import annotations

import pandas as pd

from smolfsdp.book.figures.fit_explorer import BASE, state_fit, state_key
from smolfsdp.estimate.hardware import GPUS, fit_table
from smolfsdp.estimate.recommend import recommend

NUMBERS_ROW = "needs GiB (tensor peak)"


def fit_words(estimates: dict, gpus=None) -> pd.DataFrame:
    """One row per GPU ("A100 40GB (37.3 GiB)"), one column per named estimate, each cell the verdict's word
    (fits / tight / does not fit, ``hardware.fit_table``); the first row, :data:`NUMBERS_ROW`, the numbers
    the words rest on: what the GPU must hold (reserved + CUDA context + NCCL, GiB) and the tensor peak."""
    table = fit_table(estimates, gpus)
    cards = list(dict.fromkeys(table["gpu"]))
    words = table.pivot(index="gpu", columns="setting", values="verdict").loc[cards, list(estimates)]
    memory = table.drop_duplicates("gpu").set_index("gpu")["gpu_memory_gib"]
    words.index = [f"{g} ({memory[g]:.1f} GiB)" for g in cards]
    first = table.drop_duplicates("setting").set_index("setting")
    numbers = pd.DataFrame(
        [[f"{first.need_gib[s]:.1f} ({first.peak_gib[s]:.1f})" for s in estimates]],
        index=[NUMBERS_ROW],
        columns=list(estimates),
    )
    return pd.concat([numbers, words]).rename_axis(index="GPU", columns=None)


def recommend_table(model, world_size: int = 2, gpus=None, **kw) -> pd.DataFrame:
    """``recommend`` per GPU of ``gpus`` (default: every one of ``hardware.GPUS``) for ``world_size`` GPUs and
    the settings ``kw``: the answer, its GPU count, the dearest lever, what it costs, and the verdict's line of
    the answer (``FitVerdict.line``: the need it is decided on, the tensor peak beside it, the card)."""
    rows = []
    for g in gpus or GPUS:
        r = recommend(model, g, world_size, **kw)
        rows.append(
            {"gpu": g, "answer": r.decision, "GPUs": r.gpus, "lever": r.lever,
             "what the lever costs": r.cost or "nothing: it fits as asked", "verdict": r.fit.line}
        )  # fmt: skip
    return pd.DataFrame(rows).set_index("gpu")


def explorer_reading(states: dict) -> str:
    """The sentence under the fit explorer: the verdict's line (``state_fit``) of its base setting and of that
    setting with one lever changed, on the base's GPU."""

    def at(**change) -> str:
        return f"*{state_fit(states[state_key({**BASE, **change})], BASE['gpu']).line}*"

    return (
        f"Start from the default (SmolLM3-3B, {BASE['world_size']} x {BASE['gpu']}, `{BASE['strategy']}`, "
        f"{BASE['seq_len']:,} tokens): {at()}; the activations bar says why. Turn on activation checkpointing "
        f"alone: {at(activation_checkpointing=True)}, the cheapest lever first. `SHARD_GRAD_OP` with it: "
        f"{at(activation_checkpointing=True, strategy='SHARD_GRAD_OP')}. CPU offload alone empties the first three "
        f"bars but leaves the activations ({at(offload=True)}); more GPUs shrink only the first three (8 GPUs: "
        f"{at(world_size=8)}); LoRA removes the gradients and Adam state but keeps the frozen weights' shards "
        f"({at(lora=True)})."
    )
