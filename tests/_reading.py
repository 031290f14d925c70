"""What a reader reads of a chapter (issue 41): its prose words, its sections, the code cells that only format a
sentence, and the cross-references its text makes. Used by tests/test_reading.py (the committed notebooks) and
tests/test_notebooks.py (the executed ones, whose Markdown outputs are prose too)."""

from __future__ import annotations

import ast
import re

OPTION = re.compile(r"^#\s*\|\s?")
# a fenced code block inside a Markdown cell is code, not prose
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
ATTRIBUTES = re.compile(r"\{#[^}]*\}|<!--.*?-->", re.S)  # {#sec-x} after a heading, HTML comments: not read
SEC_DEF = re.compile(r"\{#(sec-[\w-]+)")
SEC_REF = re.compile(r"(?<![\w/?])@(sec-[\w-]*\w)")
#: What the package's checking code is called by in a chapter: the audit subpackage and the views of its results.
CHECKING = re.compile(
    r"smolfsdp\.audit|\b(?:dryrun_views|allocator_views|published_rows|hfu_fit|model_vs_trace|gpu_results_section)\b"
)


def _source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def options(cell) -> list[str]:
    """A code cell's leading ``#|`` option lines, without the prefix (Quarto's rule)."""
    out = []
    for line in _source(cell).splitlines():
        m = OPTION.match(line)
        if not m:
            break
        out.append(line[m.end() :].strip())
    return out


def hidden(cell) -> bool:
    """Whether a reader sees the cell's code: not with ``#| echo: false`` or the ``remove-cell`` tag."""
    return "echo: false" in options(cell) or "remove-cell" in cell.get("metadata", {}).get("tags", [])


def _code(cell) -> str:
    return "\n".join(line for line in _source(cell).splitlines() if not OPTION.match(line))


def _is_markdown(node) -> bool:
    """``Markdown(...)``, ``display(Markdown(...))``, or either in a conditional expression (else None)."""
    if isinstance(node, ast.IfExp):
        return _is_markdown(node.body) and (
            _is_markdown(node.orelse) or (isinstance(node.orelse, ast.Constant) and node.orelse.value is None)
        )
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return False
    if node.func.id == "Markdown":
        return True
    return node.func.id == "display" and len(node.args) == 1 and _is_markdown(node.args[0])


NEUTRAL = (ast.Import, ast.ImportFrom, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.FunctionDef, ast.Pass)


def _only_sentences(body) -> tuple[bool, bool]:
    """(only sentences or neutral statements, at least one sentence) over a block of statements."""
    said = False
    for stmt in body:
        if isinstance(stmt, NEUTRAL):
            continue
        if isinstance(stmt, ast.Expr) and _is_markdown(stmt.value):
            said = True
        elif isinstance(stmt, ast.If | ast.For | ast.With):
            ok, inner = _only_sentences([*stmt.body, *getattr(stmt, "orelse", [])])
            if not ok:
                return False, said
            said = said or inner
        else:
            return False, said
    return True, said


def formats_a_sentence(cell) -> bool:
    """A code cell whose last expression is a ``Markdown(...)`` sentence, or whose every output is one: code that
    builds a sentence the page then shows, which a reader need not read twice (hidden with ``#| echo: false``)."""
    if cell["cell_type"] != "code":
        return False
    try:
        body = ast.parse(_code(cell)).body
    except SyntaxError:
        return False
    if not body:
        return False
    if isinstance(body[-1], ast.Expr) and _is_markdown(body[-1].value):
        return True
    ok, said = _only_sentences(body)
    return ok and said


def prose(cell, outputs: bool = True) -> str:
    """The text a reader reads of one cell: a Markdown cell without its code blocks and attributes; a code
    cell's Markdown outputs (``text/markdown``), when ``outputs``. Code, tables and figures are not prose."""
    if cell["cell_type"] == "markdown":
        return ATTRIBUTES.sub("", FENCE.sub("", _source(cell)))
    if cell["cell_type"] != "code" or not outputs:
        return ""
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("data", {}).get("text/markdown")
        if text:
            parts.append(text if isinstance(text, str) else "".join(text))
    return "\n".join(parts)


def words(text: str) -> int:
    """Words as a reader counts them: runs of characters between white space that hold a letter or digit."""
    return sum(1 for w in text.split() if any(ch.isalnum() for ch in w))


def prose_words(nb, outputs: bool = True) -> int:
    """A chapter's prose words: its Markdown cells and (``outputs``) the Markdown its code cells printed."""
    return sum(words(prose(c, outputs)) for c in nb["cells"])


HEADING = re.compile(r"^## ", re.M)


def sections(nb, outputs: bool = True) -> list[dict]:
    """The chapter cut at its ``## `` headings, in order: ``{"heading", "words", "code"}`` (the heading without its
    attributes, the section's prose words, its code cells); the first is named ``(intro)``. A Markdown cell that
    holds two headings is cut between them."""
    out = [{"heading": "(intro)", "words": 0, "code": []}]
    for cell in nb["cells"]:
        text = prose(cell, outputs)
        if cell["cell_type"] == "markdown":
            starts = [m.start() for m in HEADING.finditer(text)]
            out[-1]["words"] += words(text[: starts[0]] if starts else text)
            for i, s in enumerate(starts):
                chunk = text[s : starts[i + 1] if i + 1 < len(starts) else len(text)]
                title = chunk.splitlines()[0][3:].strip()
                out.append({"heading": title, "words": words(chunk), "code": []})
        else:
            out[-1]["words"] += words(text)
            if cell["cell_type"] == "code":
                out[-1]["code"].append(cell)
    return out


def checking_share(nb, outputs: bool = True) -> tuple[float, list[str]]:
    """The share of a chapter's prose words that sit in sections running the package's checking code
    (:data:`CHECKING`: the audit subpackage, the dry run's, allocator's and published rows' views, the HFU fit,
    the collectives held to a trace), and those sections' headings."""
    parts = sections(nb, outputs)
    checking = [s for s in parts if any(CHECKING.search(_code(c)) for c in s["code"])]
    total = sum(s["words"] for s in parts)
    return (sum(s["words"] for s in checking) / total if total else 0.0), [s["heading"] for s in checking]


def section_ids(text: str) -> set[str]:
    return set(SEC_DEF.findall(text))


def section_refs(text: str) -> set[str]:
    return set(SEC_REF.findall(text))
