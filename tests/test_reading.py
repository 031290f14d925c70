"""The book reads as a tutorial first (issue 41): chapter 00 teaches in under 2,500 words, the project's checks of
its own numbers live in the appendix, code that only formats a sentence is hidden, every cross-reference has a
target, and the preface's two-hour reading path names sections that exist and fit in two hours.

The notebooks' committed source is read here; tests/test_notebooks.py counts the executed chapters' Markdown
outputs too."""

import json
import re

import pytest
from _reading import (
    CHECKING,
    checking_share,
    formats_a_sentence,
    hidden,
    prose_words,
    section_ids,
    section_refs,
    sections,
)

from smolfsdp.book.chapters import chapters
from smolfsdp.paths import repo_root

ROOT = repo_root()
WORD_LIMIT = 2_500  # chapter 00's main text (issue 41: "under 2,500 words")
#: The sections the appendix took over from chapters 00 and 07, by the ids the other chapters cite.
APPENDIX_IDS = {
    "sec-checks", "sec-memory-dryrun", "sec-memory-published", "sec-memory-allocator", "sec-checks-hfu",
    "sec-checks-comm", "sec-checks-other-counts", "sec-checks-gpu",
}  # fmt: skip
#: Reading to learn, not skimming: prose at 150 words a minute and a minute for each code cell a reader sees (its
#: code, then its table, figure or listing), the preface included. The chapters' Markdown outputs are not in the
#: committed source; the path leaves room for them.
WORDS_PER_MINUTE, MINUTES_PER_VISIBLE_CELL, TWO_HOURS_MIN = 150, 1.0, 120


def _nb(stem: str) -> dict:
    return json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())


def _source(cell) -> str:
    return "".join(cell["source"])


def _code_cell(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "source": source}


def test_chapter_00_teaches_in_under_2500_words():
    """Its Markdown alone (the executed chapter's sentences are counted in tests/test_notebooks.py), and its
    line: count, bytes per parameter, breakdown, fit, levers, activations, the proof on two ranks, then one
    sentence to the appendix; none of the appendix's sections is left in it."""
    nb = _nb("00_memory")
    assert prose_words(nb, outputs=False) < WORD_LIMIT
    headings = [s["heading"] for s in sections(nb)]
    line = ["Counting parameters", "What a recipe keeps", "The breakdown per strategy", "Activations per layer",
            "Proof: the bytes that exist on two ranks"]  # fmt: skip
    where = [next(i for i, h in enumerate(headings) if h.startswith(t)) for t in line]
    assert where == sorted(where) and where[-1] == len(headings) - 1, headings
    last = _source(nb["cells"][-1])
    assert last.startswith("How these estimates are checked") and "@sec-checks" in last
    text = "".join(_source(c) for c in nb["cells"])
    assert not section_ids(text) & APPENDIX_IDS


@pytest.mark.parametrize("stem", ["00_memory", "07_scaling"])
def test_the_checks_of_the_projects_own_numbers_live_in_the_appendix(stem):
    """Chapters 00 and 07 run none of the checking code (the audit subpackage, the dry-run, allocator and
    published-row views, the HFU fit, the collectives held to a trace): 0 % of their prose sits in a section
    that does, where chapter 07 had its "Checked against" sections and chapter 00 about half its words."""
    nb = _nb(stem)
    share, names = checking_share(nb, outputs=False)
    assert (share, names) == (0.0, [])
    assert not any(CHECKING.search(_source(c)) for c in nb["cells"] if c["cell_type"] == "code")
    appendix = _nb("appendix_checks")
    assert APPENDIX_IDS <= section_ids("".join(_source(c) for c in appendix["cells"]))
    share, _ = checking_share(appendix, outputs=False)
    assert share > 0.6  # what moved: the dry run, published rows, allocator, HFU fit, collectives, GPU check


def test_a_cell_that_only_formats_a_sentence_is_recognised():
    assert formats_a_sentence(_code_cell('Markdown(f"{x} GiB")'))
    assert formats_a_sentence(_code_cell("Markdown(views.reading(grid)) if grid else None"))
    assert formats_a_sentence(_code_cell("def at(k):\n    return k\n\nMarkdown(at(1))"))
    assert formats_a_sentence(_code_cell("if have:\n    display(Markdown(a))\n    display(Markdown(b))"))
    # a table or a figure before the sentence: the cell shows more than a sentence, and must be split
    assert formats_a_sentence(_code_cell("display(tables.show(t))\nMarkdown(s)"))
    assert not formats_a_sentence(_code_cell("tables.show(t)"))
    assert not formats_a_sentence(_code_cell("display(Markdown(s))\ntables.show(t)"))
    assert not formats_a_sentence(
        _code_cell("for p in parts:\n    display(Markdown(p) if isinstance(p, str) else p)")
    )
    assert hidden(_code_cell("#| echo: false\nMarkdown(s)")) and not hidden(_code_cell("Markdown(s)"))


@pytest.mark.parametrize("nb_path", chapters(), ids=lambda p: p.stem)
def test_cells_that_only_format_a_sentence_are_hidden(nb_path):
    """Issue 41: "cells that only format a sentence are shown, then the sentence". The sentence stays, its code
    gets ``#| echo: false``; a cell that also computes what the page teaches keeps that part visible, split."""
    nb = json.loads(nb_path.read_text())
    shown = [i for i, c in enumerate(nb["cells"]) if formats_a_sentence(c) and not hidden(c)]
    assert shown == [], f"{nb_path.name}: cells {shown} only build a Markdown sentence: add `#| echo: false`"


def test_every_cross_reference_has_a_target():
    """Every ``@sec-`` the chapters, the preface and the package's generated prose cite is a ``{#sec-}`` of the
    book (Quarto would print ``?@sec-...`` on the page otherwise; tests/test_site.py checks the rendered site)."""
    book = [json.loads(p.read_text()) for p in chapters()]
    texts = ["".join(_source(c) for c in nb["cells"]) for nb in book] + [(ROOT / "index.qmd").read_text()]
    ids = set().union(*(section_ids(t) for t in texts))
    cited = {
        **{ref: "a chapter or the preface" for t in texts for ref in section_refs(t)},
        **{
            ref: str(p.relative_to(ROOT))
            for p in (ROOT / "src").rglob("*.py")
            for ref in section_refs(p.read_text())
        },
    }
    assert len(ids) >= 15 and "sec-checks" in cited
    assert {ref: where for ref, where in cited.items() if ref not in ids} == {}


def _reading_path() -> list[tuple[str, list[str]]]:
    """The preface's "In two hours" list: ``(chapter id, [section titles])``, no titles for "all of it"."""
    text = (ROOT / "index.qmd").read_text()
    block = text[text.index("**In two hours**") : text.index("**Later**")]
    items = re.split(r"^\d+\. ", block, flags=re.M)[1:]
    out = []
    for item in items:
        chapter = re.match(r"@(sec-[\w-]+)", item).group(1)
        titles = [" ".join(t.split()) for t in re.findall(r"\*([^*]+)\*", item)]
        assert titles or "all of it" in item, item
        out.append((chapter, titles))
    return out


def test_the_two_hour_reading_path_names_real_sections_and_fits_two_hours():
    path = _reading_path()
    by_id = {}
    for p in chapters():
        nb = json.loads(p.read_text())
        by_id[next(iter(section_ids(_source(nb["cells"][0]))))] = nb
    assert [c for c, _ in path] == [c for c in by_id if c in dict(path)], "in book order"
    minutes = prose_words({"cells": [{"cell_type": "markdown", "source": _preface()}]}) / WORDS_PER_MINUTE
    for chapter, titles in path:
        parts = sections(by_id[chapter], outputs=False)
        headings = [s["heading"] for s in parts]
        assert set(titles) <= set(headings), (chapter, sorted(set(titles) - set(headings)))
        read = [s for s in parts if not titles or s["heading"] in titles or s["heading"] == "(intro)"]
        visible = sum(not hidden(c) for s in read for c in s["code"])
        minutes += sum(s["words"] for s in read) / WORDS_PER_MINUTE + visible * MINUTES_PER_VISIBLE_CELL
    assert 75 < minutes < TWO_HOURS_MIN, minutes  # 97 min when it was written
    later = _preface()[_preface().index("**Later**") :]
    assert {"sec-gotchas", "sec-seed-claims", "sec-checks"} <= section_refs(later)


def _preface() -> str:
    return (ROOT / "index.qmd").read_text()
