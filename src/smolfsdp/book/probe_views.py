"""Sentences of the chapter "FSDP mechanics" that read the step probe (``smolfsdp.probes.step``):
what resharding the root costs and saves, and how high each variant's memory hill is, each compared
with the spread of the same peak over the probe's steady steps, so no CPU noise is read as a saving; how
to read the step timelines, naming each block's colour from ``smolfsdp.book.figures.palette`` (the colours
``mechanisms.plot_step_timeline`` draws with), so a sentence cannot name a colour the figure does not use.

    python -c "from smolfsdp.probes.step import measure_step_variants as m; from smolfsdp.book import \\
        probe_views as v; r = {x['variant']: x for x in m('/tmp/probe')[0]}; print(v.memory_sentence(r))"
"""

from __future__ import annotations

from smolfsdp.book.figures import palette
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.probes.step import MEMORY_STEPS

KIB = 1024


def peak_range_text(result: dict) -> str:
    """``"8,400 – 8,983 KiB"``: a variant's step peak above the step's start, lowest to highest step."""
    lo, hi = (b / KIB for b in result["peak_above_start_range_bytes"])
    return f"{lo:,.0f} KiB" if lo == hi else f"{lo:,.0f} – {hi:,.0f} KiB"


def peaks_differ(a: dict, b: dict) -> bool:
    """True when the two variants' peak ranges over the steady steps do not overlap: a difference that
    one run's step-to-step spread cannot explain."""
    (lo_a, hi_a), (lo_b, hi_b) = a["peak_above_start_range_bytes"], b["peak_above_start_range_bytes"]
    return hi_a < lo_b or hi_b < lo_a


def _gathered_bytes(result: dict) -> int:
    return sum(c["bytes"] for c in result["collectives"] if c["kind"] == "all-gather")


def root_reshard_sentence(
    kept: dict, resharded: dict, model: str = "smollm3-3b", label: str = "SmolLM3-3B"
) -> str:
    """What resharding the root did in the probe (all-gathers, bytes, loss, peak against its spread) and
    what the root weighs for ``model``: its embedding, ``vocab_size x hidden_size`` in bf16 (2 bytes),
    tied to ``lm_head`` in SmolLM3, so one matrix."""
    n_kept = sum(c["kind"] == "all-gather" for c in kept["collectives"])
    n_resharded = sum(c["kind"] == "all-gather" for c in resharded["collectives"])
    if peaks_differ(kept, resharded):
        higher = resharded["peak_above_start_range_bytes"][0] > kept["peak_above_start_range_bytes"][1]
        peak = f"a peak {'higher' if higher else 'lower'} than the default's beyond the step-to-step spread"
    else:
        peak = "a peak inside the default's step-to-step spread, so no memory saved that one CPU run can show"
    config = resolve_model_config(model)
    embedding = config.vocab_size * config.hidden_size
    return (
        f"Resharding the root adds one all-gather per step ({n_resharded} instead of {n_kept}), "
        f"{_gathered_bytes(resharded) - _gathered_bytes(kept):,} more bytes gathered per rank, "
        f"{'the same loss' if kept['loss'] == resharded['loss'] else 'a different loss'} and {peak} "
        f"({peak_range_text(resharded)} against {peak_range_text(kept)} over {MEMORY_STEPS} steps). So "
        "`apply_fsdp2` keeps the root gathered (`root_reshard_after_forward=False`) and reshards only the "
        f"decoder layers. For {label} the root is the {config.vocab_size:,} x {config.hidden_size:,} "
        f"embedding, {embedding * 2 / 2**30:.2f} GiB in bf16: one all-gather of that per step, saved."
    )


def memory_sentence(by_variant: dict[str, dict]) -> str:
    """How to read the memory figure: each drawn variant's peak over the steady steps, and which
    differences lie outside the step-to-step spread (only those are differences)."""
    default = by_variant["root kept (default)"]
    shown = ("root kept (default)", "root resharded", "nothing resharded")
    ranges = "; ".join(f"{v}: {peak_range_text(by_variant[v])}" for v in shown)
    apart = [v for v in shown[1:] if peaks_differ(default, by_variant[v])]
    verdict = (
        f"Only the {' and the '.join(repr(v) for v in apart)} variant's peak lies outside the default's "
        "range: that difference is real"
        if apart
        else "Every range overlaps the default's: on this tiny model no variant's peak differs beyond the noise"
    )
    return (
        f"Read the height of each hill, the peak over {MEMORY_STEPS} steady steps of one run ({ranges}). "
        f"{verdict}; the rest is gloo's own buffers coming and going beside the step. The top of the hill is "
        "the end of forward, where every saved activation is alive; on a GPU (`torch.cuda.memory_allocated` "
        "over a step) the same shape appears, with the gathered bf16 units as steps of one layer's size at "
        "each all-gather and free."
    )


def timeline_colours_sentence() -> str:
    """How to read the step timeline's blocks, each named by its colour in the palette: all-gather,
    reduce-scatter, and where a unit computes (``palette.TRACE_CATEGORY["compute"]``)."""
    ag, rs = (
        palette.word(palette.COLLECTIVE["all-gather"]),
        palette.word(palette.COLLECTIVE["reduce-scatter"]),
    )
    compute = palette.word(palette.TRACE_CATEGORY["compute"])
    return (
        f"Each decoder layer is a lane, the root (embedding, final norm and the tied `lm_head`) another. Blocks in "
        f"{ag} are all-gathers (AG) of that unit's parameters, {rs} reduce-scatters (RS) of its gradients, "
        f"{compute} where the unit computes (the book's colours: `smolfsdp.book.figures.palette`); the step's "
        "phases are shaded behind. Collectives on a CPU last a fraction of a millisecond, so every block is "
        "drawn at least 3% of the step wide; hover for the real duration."
    )


def prefetch_reading() -> str:
    """The sentence under the explicit-prefetch timeline: where the forward all-gathers moved (the compute
    block named by its palette colour), what did not change, and what explicit prefetching adds on a GPU
    beyond the default overlap (``smolfsdp.book.library_facts.prefetch_markdown``)."""
    compute = palette.word(palette.TRACE_CATEGORY["compute"])
    return (
        "Compare with the first timeline: with explicit prefetch the forward all-gather of layer *i+1* sits at "
        f"the start of layer *i*'s {compute} block instead of after it. The counts and bytes do not change (the "
        '"explicit prefetch" and "root kept (default)" rows of the table above); only when they are issued. On '
        "CPU, gloo runs the transfers one after another on its own threads, so the step takes no less time. On a "
        "GPU the all-gathers run on their own CUDA stream in both cases, so the default already overlaps a "
        "layer's all-gather with the previous layer's matmuls when the CPU runs ahead; explicit prefetching "
        "issues it earlier from the CPU, which helps where the CPU falls behind (small layers, CPU-heavy steps), "
        "and a longer list gathers more than one layer ahead. How much a step hides is a measurement: "
        "@sec-profiling reads overlap from a trace, and the one real GPU trace there is a DDP run, so FSDP's "
        "case on GPUs is still to be measured."
    )
