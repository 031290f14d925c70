"""Code listings for the book's pages: the package's own source, read when the page renders.

Each teaching chapter shows the torch / transformers / TRL / peft / accelerate code that ran in it, as
pytorch/examples' FSDP2 example shows its one screen of code: :func:`show_source` prints a function,
method or class of ``smolfsdp`` as it is in the file now, :func:`show_file` a config file (an accelerate
YAML, a run recipe). Both return a :class:`Listing`, which a notebook displays as Markdown (IPython's
``_repr_markdown_`` protocol): a header with the file's path in the repository and the line range, then
a fenced code block, which Quarto, JupyterLab and nbconvert all render as highlighted code. The chapter
cell that calls them is hidden (``#| echo: false``), so the page shows the listing and the prose around
it. A listing is never a copy: ``tests/test_listings.py`` holds every chapter's listings to the source.

    python -c "from smolfsdp.book.listings import show_source; from smolfsdp.sharding.fsdp2 import apply_fsdp2; print(show_source(apply_fsdp2))"
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import smolfsdp
from smolfsdp.paths import repo_root

#: fence languages by file suffix (:func:`show_file`)
LANGUAGES = {
    ".py": "python",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
    ".json": "json",
    ".sh": "bash",
}


@dataclass(frozen=True, repr=False)
class Listing:
    """A listing as the page shows it.

    ``path``: the file relative to the repository root (``src/smolfsdp/sharding/fsdp2.py``); ``first_line``
    and ``last_line``: the object's lines in that file (1-based, inclusive); ``code``: the text in the code
    block (dedented; without the docstring's lines when ``note`` says so); ``name``: the object's qualified
    name, None for a whole file.
    """

    path: str
    first_line: int
    last_line: int
    language: str
    code: str
    name: str | None = None
    note: str = ""

    @property
    def n_lines(self) -> int:
        """Lines in the code block."""
        return len(self.code.splitlines())

    @property
    def header(self) -> str:
        """``src/smolfsdp/sharding/fsdp2.py``, lines 34-81: ``apply_fsdp2`` (...), in Markdown."""
        where = f"lines {self.first_line}-{self.last_line}"
        what = f": `{self.name}`" if self.name else " (the whole file)"
        return f"**`{self.path}`**, {where}{what}" + (f" ({self.note})" if self.note else "")

    @property
    def markdown(self) -> str:
        """The header, then the code in a fence longer than any backtick run inside it."""
        runs = [len(r) for r in re.findall(r"`+", self.code)]
        fence = "`" * max(3, max(runs, default=0) + 1)
        return f"{self.header}\n\n{fence}{self.language}\n{self.code}\n{fence}\n"

    def _repr_markdown_(self) -> str:
        return self.markdown

    def __repr__(self) -> str:  # text/plain: what a console or a plain-text output shows
        return f"{self.path}, lines {self.first_line}-{self.last_line}\n\n{self.code}"


def _display_path(path: Path) -> str:
    """``src/smolfsdp/...`` for a module of the package wherever it is installed; else relative to the repository."""
    path = path.resolve()
    package_parent = Path(smolfsdp.__file__).resolve().parent.parent
    if path.is_relative_to(package_parent):
        return "src/" + path.relative_to(package_parent).as_posix()
    return path.relative_to(repo_root()).as_posix()


def docstring_lines(source: str) -> range | None:
    """0-based line indices of the docstring of the definition ``source`` starts with (dedented text) and of
    the blank lines right after it, or None when it has none. Raises SyntaxError when ``source`` is not one
    definition."""
    node = ast.parse(source).body[0]
    body = getattr(node, "body", [])
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
        return None
    if not isinstance(body[0].value.value, str):
        return None
    lines, end = source.splitlines(), body[0].end_lineno
    while end < len(lines) and not lines[end].strip():
        end += 1
    return range(body[0].lineno - 1, end)


def show_source(obj, *, docstring: bool = False) -> Listing:
    """The source of ``obj`` (a function, method or class of any module) as it is in its file now.

    The lines are ``inspect.getsourcelines(obj)``, dedented (a method's ``def`` starts at column 0);
    ``docstring=False`` (the default) leaves out the object's own docstring (and the blank lines after it),
    which the page's prose replaces, and says so in the header. Raises TypeError for an object without source (a builtin),
    OSError when its file cannot be read.
    """
    lines, first = inspect.getsourcelines(obj)
    source = textwrap.dedent("".join(lines))
    shown = source.splitlines()
    doc = None if docstring else docstring_lines(source)
    if doc is not None:
        shown = [line for i, line in enumerate(shown) if i not in doc]
    return Listing(
        path=_display_path(Path(inspect.getsourcefile(obj))),
        first_line=first,
        last_line=first + len(lines) - 1,
        language="python",
        code="\n".join(shown).rstrip("\n"),
        name=getattr(obj, "__qualname__", getattr(obj, "__name__", None)),
        note="docstring left out" if doc is not None else "",
    )


def show_file(path: str | Path, language: str | None = None) -> Listing:
    """A whole text file of the repository (``path`` relative to its root, e.g.
    ``configs/accelerate/2gpu.yaml``) as a listing; ``language`` from the suffix unless given
    (:data:`LANGUAGES`, else plain text). Raises FileNotFoundError for a missing file."""
    full = repo_root() / path
    text = full.read_text().rstrip("\n")
    return Listing(
        path=Path(path).as_posix(),
        first_line=1,
        last_line=len(text.splitlines()),
        language=language or LANGUAGES.get(full.suffix, ""),
        code=text,
    )
