"""The book's colours: each meaning one colour, and each colour one meaning, in every chapter.

Every figure module (``smolfsdp.book.figures.*``, ``smolfsdp.book.dryrun_views``) takes its colours from here,
so red means "does not fit" and nothing else, a backward phase is the same purple in the dry run's step and the
probe's timeline, and an all-gather the same orange in the mechanics chapter and the trace lanes.
``tests/test_palette.py`` builds figures and holds their trace colours to this module, and checks that no
colour stands for two meanings.

    python -c "from smolfsdp.book.figures import palette; print(palette.meanings())"
"""

from __future__ import annotations

#: a memory verdict against a GPU's memory (the fit explorer, any "fits" mark)
VERDICT = {"fits": "#2ca02c", "tight": "#f0a30a", "does not fit": "#d62728"}
#: the phases of a training step (dry-run step memory, probe timelines, per-pass gathers)
PHASE = {
    "forward": "#1f77b4",
    "loss": "#17becf",
    "backward": "#9467bd",
    "clip": "#7f7f7f",
    "optimizer": "#8c564b",
}
#: collectives, wherever they are drawn (mechanics timeline and volumes, trace lanes)
COLLECTIVE = {
    "all-gather": "#ff7f0e",
    "reduce-scatter": "#e377c2",
    "all-reduce": "#bcbd22",
    "broadcast": "#c49c94",
    "other collective": "#dbdb8d",
}
#: where a number comes from: a measurement (or a trace) against the estimate
SOURCE = {"measured": "#252525", "estimated": "#969696"}
#: communication time against compute (the trace's overlap figure)
OVERLAP = {"overlapped with compute": "#9ecae1", "exposed": "#fd8d3c"}
#: the estimate's memory components (stacked bars, the fit explorer): blues for the sharded state, purples for
#: the gathered/transient copies, browns and oranges for what follows the tokens, greys for fixed allowances
COMPONENT = {
    "params": "#084594",
    "grads": "#4292c6",
    "master": "#c6dbef",
    "optimizer": "#2171b5",
    "gathered": "#756bb1",
    "grad_buffer": "#bcbddc",
    "no_sync_grads": "#dadaeb",
    "activations": "#a63603",
    "logits": "#fdae6b",
    "cuda_context": "#636363",
    "comm_buffers": "#bdbdbd",
}
#: kinds of trace events (the Perfetto-like timeline)
TRACE_CATEGORY = {
    "compute": "#1b9e77",
    "cpu_op": "#66c2a5",
    "communication": "#d95f02",
    "memory": "#7570b3",
    "fsdp": "#e7298a",
    "step": "#666666",
    "annotation": "#a6761d",
    "runtime": "#e6ab02",
    "other": "#e5e5e5",
}
#: sharding strategies (the scaling chapter)
STRATEGY = {
    "NO_SHARD": "#525252",
    "SHARD_GRAD_OP": "#fdb863",
    "FULL_SHARD": "#5e3c99",
    "HYBRID_SHARD": "#b2abd2",
}
#: loss curves
LOSS = {"train": "#3690c0", "eval": "#014636"}
#: which rank holds a piece of a parameter, and the padding no parameter uses (the sharding schematics)
SHARD = {"rank 0": "#80b1d3", "rank 1": "#ffed6f", "padding": "#d9d9d9"}

FAMILIES = {
    "verdict": VERDICT, "phase": PHASE, "collective": COLLECTIVE, "source": SOURCE, "overlap": OVERLAP,
    "component": COMPONENT, "trace category": TRACE_CATEGORY, "strategy": STRATEGY, "loss": LOSS, "shard": SHARD,
}  # fmt: skip


def meanings() -> dict[str, list[str]]:
    """Colour -> the meanings (``"family: key"``) it stands for; every list has one entry (the tests hold it)."""
    out: dict[str, list[str]] = {}
    for family, colours in FAMILIES.items():
        for key, colour in colours.items():
            out.setdefault(colour.lower(), []).append(f"{family}: {key}")
    return out


#: the words prose uses for a colour it names (a sentence under a figure reads them from here)
WORDS = {
    COLLECTIVE["all-gather"]: "orange", COLLECTIVE["reduce-scatter"]: "pink", TRACE_CATEGORY["compute"]: "teal",
    TRACE_CATEGORY["communication"]: "dark orange", OVERLAP["exposed"]: "light orange",
    OVERLAP["overlapped with compute"]: "light blue", VERDICT["fits"]: "green", VERDICT["tight"]: "amber",
    VERDICT["does not fit"]: "red",
    SHARD["rank 0"]: "blue", SHARD["rank 1"]: "yellow", SHARD["padding"]: "light grey",
    COMPONENT["params"]: "dark blue", COMPONENT["gathered"]: "purple",
}  # fmt: skip


def word(colour: str) -> str:
    """The word for a colour of :data:`WORDS` (KeyError for one prose should not name)."""
    return WORDS[colour]


def verdict_colour(word: str) -> str:
    """The colour of a fit verdict's word (``smolfsdp.estimate.hardware.VERDICTS``: fits, tight, does not fit);
    KeyError for another word."""
    return VERDICT[word]
