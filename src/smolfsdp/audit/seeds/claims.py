"""The seeds' checkable claims, each judged with evidence the package computes when it is called.

Used by the chapter "What the seeds say, and what we measured" (notebooks/08_seed_claims.ipynb). The two
seeds are the texts this book grew from: seed 1, a blog post fine-tuning SmolLM3-3B with TRL's
``SFTTrainer`` and FSDP1 on two GPUs (memory table, fit table, ``fsdp_config``, three gotchas, a profiler
trace); seed 2, a blog post on FSDP, FSDP1 vs FSDP2 and LoRA with FSDP2 in a plain PyTorch loop. Each
:class:`Judgement` holds the claim in the book's words, the seed and section it comes from, a verdict that
starts with holds / partly / wrong / open, the evidence (numbers from ``smolfsdp.estimate.memory``, runs on
gloo ranks, the ``file:line`` of the installed source that decides it) and the correction.

The claims live in modules by subject: ``memory_claims`` (bytes per GPU, what fits), ``trainer_claims`` (what TRL,
transformers and accelerate do with the seed's settings), ``step_claims`` (gathers, traffic, prefetch, overlap),
``fsdp2_claims`` (dtypes, LoRA, state dicts, meta init); the 2-rank run of the seeds' code as written is
``seed_code``; :data:`INVENTORY` is the chapter's order.
Claims whose evidence is a per-GPU memory number have ``memory=True``: their ``evidence`` list is where a
full-size measurement (a dry run, a GPU run) is appended.

    python -c "from smolfsdp.audit.seeds.claims import judge_all, summary_table; print(summary_table(judge_all()))"
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from smolfsdp.audit.seeds.fsdp2_claims import (
    bf16_reduce,
    deterministic_memory,
    dtype_rule,
    flat_parameter,
    gotcha1_dtensor,
    meta_init,
    offload_policy,
    seed2_adapters,
    seed2_reading,
    seed2_table,
    seed2_wrap,
    state_dict_table,
)
from smolfsdp.audit.seeds.installed_stack import source_line
from smolfsdp.audit.seeds.judgement import (
    GB,
    GIB,
    SEED1,
    SEED2,
    VERDICTS,
    Judgement,
    book_recipe_kwargs,
    book_recipe_table,
    gb,
    gib,
)
from smolfsdp.audit.seeds.memory_claims import (
    batch_size_lever,
    bf16_weights,
    bytes_per_param,
    checkpointing_saves,
    eight_b_full,
    fit_table_rows,
    full_model_memory,
    gpu_memory_order,
    lora_size,
    per_gpu_memory,
    sixteen_gb_on_four,
    static_divides,
)
from smolfsdp.audit.seeds.step_claims import (
    GPU_TRACE,
    comm_volume,
    gathers_per_layer,
    prefetch_overlap,
    sawtooth_units,
    shards_everything,
    state_dict_comm,
    step_bursts,
)
from smolfsdp.audit.seeds.trainer_claims import (
    checkpoint_size,
    fsdp1_pin,
    fsdp_config_as_written,
    fsdp_config_table,
    offload_key,
    plugin_args_side_by_side,
    save_strategy_no,
    tracker_env,
    wrap_class_trainer,
)

__all__ = [
    "GB", "GIB", "GPU_TRACE", "SEED1", "SEED2", "VERDICTS", "INVENTORY", "Judgement", "book_recipe_kwargs",
    "book_recipe_table", "claim_markdown", "fsdp_config_table", "gb", "gib", "inventory_table", "judge_all", "plugin_args_side_by_side",
    "seed2_reading", "seed2_table", "source_line", "state_dict_table", "summary_table", "verdict_summary",
]  # fmt: skip

# What each claim needs: nothing, the dtype-rule run (``check_dtype_rule``) or the seed-code run.
NONE, DTYPE, SEED_CODE = "none", "dtype", "seed_code"
#: every checkable claim of both seeds, in the chapter's order (seed 1 by section, then seed 2)
INVENTORY: tuple[tuple[Callable[..., Judgement], str], ...] = (
    (bf16_weights, NONE), (bytes_per_param, NONE), (full_model_memory, NONE), (fit_table_rows, NONE),
    (batch_size_lever, NONE), (per_gpu_memory, NONE), (gathers_per_layer, SEED_CODE),
    (fsdp_config_as_written, NONE), (wrap_class_trainer, SEED_CODE), (offload_key, NONE),
    (gotcha1_dtensor, SEED_CODE), (fsdp1_pin, NONE), (checkpoint_size, SEED_CODE), (save_strategy_no, NONE),
    (tracker_env, NONE), (prefetch_overlap, NONE), (step_bursts, NONE), (sawtooth_units, SEED_CODE),
    (static_divides, NONE), (gpu_memory_order, NONE),
    (shards_everything, SEED_CODE), (comm_volume, NONE), (flat_parameter, DTYPE), (state_dict_comm, SEED_CODE),
    (deterministic_memory, NONE), (meta_init, SEED_CODE), (seed2_adapters, SEED_CODE), (checkpointing_saves, NONE),
    (seed2_wrap, SEED_CODE), (bf16_reduce, SEED_CODE), (dtype_rule, DTYPE), (offload_policy, NONE),
    (lora_size, NONE), (sixteen_gb_on_four, NONE), (eight_b_full, NONE),
)  # fmt: skip


def judge_all(dtype_results: list[dict] | None = None, seed_code: dict | None = None) -> list[Judgement]:
    """Every claim judged, in the chapter's order. The claims that need a launched run are judged when its
    result is given (``dtype_results`` from ``check_dtype_rule``, ``seed_code`` from ``run_seed_code``) and
    left out otherwise; ``wrap_class_trainer`` is judged either way (the run adds a sentence)."""
    out = []
    for claim, needs in INVENTORY:
        if claim is wrap_class_trainer:
            out.append(claim(seed_code))
        elif needs == NONE:
            out.append(claim())
        elif needs == DTYPE and dtype_results is not None:
            out.append(claim(dtype_results))
        elif needs == SEED_CODE and seed_code is not None:
            out.append(claim(seed_code))
    return out


def summary_table(judgements: list[Judgement]) -> pd.DataFrame:
    """One row per claim: seed, section, what the seed says and the verdict (plain text, no truncation)."""
    return pd.DataFrame(
        [
            # a table cell is plain text, not Markdown: code marks would show as literal backticks
            {
                "seed": j.seed.split(" (")[0],
                "section": j.section,
                "topic": j.topic.replace("`", ""),
                "the seed says": j.says.replace("`", ""),
                "verdict": j.verdict,
            }
            for j in judgements
        ]
    ).set_index("topic")


def inventory_table(judgements: list[Judgement]) -> pd.DataFrame:
    """The closing inventory: one short line per claim (seed, section, topic, verdict)."""
    return summary_table(judgements).drop(columns="the seed says")


def claim_markdown(j: Judgement) -> str:
    """A claim as a reader's paragraph block (Markdown)."""
    evidence = "\n\n".join(j.evidence)
    return (
        f"### {j.topic[0].upper() + j.topic[1:]} ({j.seed.split(' (')[0]}, {j.section})\n\n"
        f"**The seed says:** {j.says}\n\n**Verdict:** {j.verdict}.\n\n"
        f"**Evidence, computed now:** {evidence}\n\n**Correction:** {j.correction}\n"
    )


def verdict_summary(judgements: list[Judgement]) -> str:
    """One sentence counting the verdicts by their first word, e.g. "Of 31 claims, 13 hold, ..."."""
    by = {k: [j for j in judgements if j.kind == k] for k in VERDICTS}
    n = {k: len(v) for k, v in by.items()}
    stack = [j for j in by["wrong"] if "this stack" in j.verdict]
    opened = "; ".join(f"{j.topic} ({j.verdict.split(': ', 1)[-1]})" for j in by["open"])
    one = {k: v == 1 for k, v in n.items()}
    return (
        f"Of {len(judgements)} claims, {n['holds']} hold{'s' * one['holds']}, {n['partly']} "
        f"hold{'s' * one['partly']} only in part, {n['wrong']} {'is' if one['wrong'] else 'are'} wrong "
        f"({len(stack)} of them because of how the pinned libraries behave)"
        + (f", and {n['open']} stay{'s' * one['open']} open: {opened}." if by["open"] else ".")
    )
