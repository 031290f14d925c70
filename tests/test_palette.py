"""Colours that mean the same in every chapter (issue 33): each colour of the book's figures comes from
``smolfsdp.book.figures.palette``, one colour per meaning, and red only ever says "does not fit"."""

import pandas as pd

from smolfsdp.book import dryrun_views
from smolfsdp.book.figures import fit_explorer, mechanisms, palette, scale, schematics
from smolfsdp.book.figures import timeline as trace
from smolfsdp.book.figures.memory_bars import plot_estimate_vs_measured, plot_memory_breakdown
from smolfsdp.estimate.memory import estimate_memory

RED = palette.VERDICT["does not fit"]


def _colours(fig) -> list[str]:
    """Every trace colour a figure draws (markers, lines), and its shapes' fills (phase shading)."""
    out = []
    for t in fig.data:
        for c in (
            getattr(getattr(t, "marker", None), "color", None),
            getattr(getattr(t, "line", None), "color", None),
        ):
            out += [c] if isinstance(c, str) else list(c) if isinstance(c, (list, tuple)) else []
    out += [s.fillcolor for s in fig.layout.shapes if s.fillcolor]
    return [c.lower() for c in out]


def test_no_colour_stands_for_two_meanings():
    shared = {c: m for c, m in palette.meanings().items() if len(m) > 1}
    assert not shared, shared
    assert palette.meanings()[RED] == ["verdict: does not fit"]


def test_figures_draw_with_the_palette_and_red_means_does_not_fit():
    known = set(palette.meanings()) | {"black"}  # black: a GPU's memory line, a peak mark
    est = {
        "x2": estimate_memory(world_size=2, activation_checkpointing=True),
        "x1": estimate_memory(world_size=1),
    }
    grid = dryrun_views.load_grid()
    steps = pd.DataFrame({"step": [1, 2], "overlap_us": [5.0, 6.0], "exposed_comm_us": [1.0, 2.0],
                          "overlap_pct": [80.0, 75.0]})  # fmt: skip
    measured = pd.DataFrame(
        {"case": ["fp32"], "rank": [0], "measured_static": [1024], "estimated_static": [1024]}
    )
    figures = {
        "memory breakdown": plot_memory_breakdown(est),
        "estimate vs measured": plot_estimate_vs_measured(measured),
        "dry-run step": dryrun_views.plot_step_memory(grid["runs"][0]),
        "comm volumes": mechanisms.plot_comm_volumes(mechanisms.comm_volume_table("smollm3-3b", n_gpus=8)),
        "overlap": trace.plot_overlap(steps),
        "step schematic": schematics.plot_step_schematic(schematics.step_schedule(), schematics.unit_bytes()),
        "flat vs DTensor": schematics.plot_flat_vs_dtensor(schematics.shard_segments()),
    }
    for name, fig in figures.items():
        colours = _colours(fig)
        assert colours and set(colours) <= known, (name, set(colours) - known)
        assert RED not in colours, name  # none of these is a verdict
    # the dry run's phases are the phases' colours (its backward was red, the colour of "does not fit")
    dry = {t.name: t.marker.color.lower() for t in figures["dry-run step"].data}
    assert dry["backward"] == palette.PHASE["backward"] and dry["forward"] == palette.PHASE["forward"]
    vols = {t.name: t.marker.color for t in figures["comm volumes"].data}
    assert vols["all-gather"] == palette.COLLECTIVE["all-gather"] == mechanisms.KIND_COLORS["all-gather"]
    # the fit explorer: component colours, then the tensor peak and need bars in the verdict's colour
    assert fit_explorer._colors(["params", "activations"], "fits")[-2:] == [palette.VERDICT["fits"]] * 2
    assert fit_explorer._colors(["params", "activations"], "tight")[-1] == palette.VERDICT["tight"]
    assert fit_explorer._colors(["params", "activations"], "does not fit")[-1] == RED
    assert RED not in fit_explorer._colors(list(palette.COMPONENT), "fits")
    assert scale.STRATEGY_COLORS == palette.STRATEGY and trace.CATEGORY_COLORS == palette.TRACE_CATEGORY


def test_prose_names_colours_by_the_palettes_words():
    """A sentence that names a colour reads it from ``palette.WORDS``: one word per colour, red only for the
    verdict, and chapter 02's lane legend in those words."""
    import json
    from pathlib import Path

    words = palette.WORDS
    assert set(words) <= set(palette.meanings()) and len(set(words.values())) == len(words)
    assert [c for c, w in words.items() if w == "red"] == [RED]
    nb = Path(__file__).resolve().parents[1] / "notebooks" / "02_fsdp_mechanics.ipynb"
    text = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    ag, rs = (words[palette.COLLECTIVE[k]] for k in ("all-gather", "reduce-scatter"))
    from smolfsdp.book import probe_views

    legend = probe_views.timeline_colours_sentence()  # the chapter prints it, never a typed colour
    assert "probe_views.timeline_colours_sentence()" in text
    assert f"{ag} are all-gathers" in legend and f"{rs} reduce-scatters" in legend
    # chapter 00's fit explorer: the verdict's three colours, each by its word
    memory = nb.with_name("00_memory.ipynb")
    text = "".join("".join(c["source"]) for c in json.loads(memory.read_text())["cells"])
    fit, tight, out = (words[palette.VERDICT[w]] for w in ("fits", "tight", "does not fit"))
    assert f"{fit} fits, {tight} tight, {out} does not fit" in text
