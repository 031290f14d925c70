"""What a judged seed claim is, and what every claim module shares: units, the seeds' sections, the book's recipe.

Used by ``smolfsdp.audit.seeds.claims`` (chapter "What the seeds say, and what we measured") and the claim modules,
grouped by subject: ``memory_claims`` (bytes per GPU), ``trainer_claims`` (what TRL, transformers and accelerate do
with the seed's settings), ``step_claims`` (what one FSDP step gathers, sends and overlaps), ``fsdp2_claims`` (FSDP2's
rules: dtypes, LoRA, state dicts, meta init).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from smolfsdp.estimate.recipe_peak import recipe_settings
from smolfsdp.paths import repo_root

GIB = 2**30
GB = 10**9
SEED1 = "seed 1 (SmolLM3-3B, TRL + FSDP1)"
SEED2 = "seed 2 (LoRA + FSDP2, plain loop)"


#: the first word of every verdict: what a reader can do with the claim
VERDICTS = ("holds", "partly", "wrong", "open")


@dataclass(frozen=True)
class Judgement:
    """One claim judged. ``evidence`` is a list of sentences, each computed when the claim is judged; a later
    source of evidence (e.g. a full-size dry run for the ``memory`` claims) appends its own sentence to it.
    ``values`` are the computed numbers the text quotes (bytes are bytes). ``verdict`` starts with one of
    :data:`VERDICTS`; ``section`` is where in its seed the claim is made."""

    key: str
    seed: str
    section: str
    topic: str
    says: str
    verdict: str
    evidence: list[str]
    correction: str
    values: dict = field(default_factory=dict)
    memory: bool = False  # a per-GPU memory number: estimator evidence now, room for a dry run's

    def __post_init__(self) -> None:
        if self.verdict.split(":")[0].split(",")[0].split()[0] not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} of {self.key} must start with one of {VERDICTS}")

    @property
    def kind(self) -> str:
        """``holds``, ``partly``, ``wrong`` or ``open``."""
        return self.verdict.split(":")[0].split(",")[0].split()[0]

    @property
    def evidence_text(self) -> str:
        return " ".join(self.evidence)


def gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB"


def gb(n: int) -> str:
    return f"{n / GB:,.1f} GB"


def book_recipe_kwargs(name: str = "smollm3_3b_medical") -> dict:
    """``estimate_memory`` arguments of the book's committed run recipe (configs/runs/<name>.yaml), read by
    ``smolfsdp.estimate.recipe_peak.recipe_settings`` (the one path every page's peak takes): sequence =
    ``max_length``, micro-batch, activation checkpointing, FSDP version, LoRA (its dropout included), gradient
    accumulation (the last micro-batch's backward starts with every gradient shard held)."""
    s = recipe_settings(name)
    keys = (
        "seq_len",
        "micro_batch",
        "activation_checkpointing",
        "fsdp_version",
        "lora",
        "gradient_accumulation_steps",
    )
    return {k: s[k] for k in keys}


def book_recipe_table(name: str = "smollm3_3b_medical") -> pd.DataFrame:
    """The recipe settings the estimates use, as a reader's table (units, words, separators); each claim's
    evidence names the settings of its own peak (``smolfsdp.estimate.recipe_peak.settings_line``)."""
    kw = book_recipe_kwargs(name)
    return pd.Series(
        {
            "sequence length (tokens, max_length)": f"{kw['seq_len']:,}",
            "micro-batch per GPU (sequences)": f"{kw['micro_batch']:,}",
            "tokens per GPU per micro-batch": f"{kw['seq_len'] * kw['micro_batch']:,}",
            "gradient accumulation (micro-batches per optimizer step)": f"{kw['gradient_accumulation_steps']:,}",
            "activation checkpointing": "on" if kw["activation_checkpointing"] else "off",
            "FSDP version": f"FSDP{kw['fsdp_version']}",
            "LoRA": "yes" if kw["lora"] else "no (full fine-tune)",
        },
        name=f"configs/runs/{name}.yaml",
    ).to_frame()


#: the sections of seed 1 and seed 2 that the claims cite
MEMORY, BATCH, CONFIG, GOTCHA2, GOTCHA3, TRACE = (
    "§2 where the memory goes", "§2 warning: batch size", "§4 configuring FSDP in the Trainer",
    "§5.2 gotcha 2: the checkpoint fills the disk", "§5.3 gotcha 3: metrics in the wrong place",
    "§6.1 reading the profiler trace",
)  # fmt: skip


VS, SETUP, SUMMARY = "FSDP1 vs FSDP2", "setting up LoRA + FSDP2", "summary"


#: the committed full-size dry-run grid (``scripts/dryrun_grid.py``): FSDP1 and FSDP2 at equal shapes
DRYRUN_GRID = repo_root() / "data" / "results" / "dryrun" / "grid.json"
