"""The pages show the code that ran (issue 41): every teaching chapter lists real torch / transformers / TRL /
peft / accelerate code of the package, read from its source when the page renders, so page and code cannot
drift; chapter 01 gives the README's two-GPU commands, word for word.

Each listing cell of a chapter is self-contained (it imports ``show_source``/``show_file`` and the object), so
it is run here as it is written, without a kernel, and its listing compared with the file.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter

from smolfsdp.book.chapters import chapters
from smolfsdp.book.listings import Listing, show_file, show_source
from smolfsdp.paths import repo_root
from smolfsdp.sharding import fsdp2
from smolfsdp.train.native import NativeTrainer

#: the teaching chapters: 00 to 07 (08 audits the seeds; appendices judge the estimates)
TEACHING = [nb for nb in chapters() if re.match(r"0[0-7]_", nb.stem)]
#: what shows that a listing is torch / transformers / TRL / peft / accelerate code, not the package's own glue
API_CALLS = (
    "fully_shard(", "FullyShardedDataParallel(", "init_device_mesh(", "get_peft_model(", "LoraConfig(",
    "dcp.save(", "set_model_state_dict(", "profile(", "schedule(", "SFTTrainer", "SFTConfig(",
    "transformer_layer_cls_to_wrap", "distributed_type:", "optimizer.step()", ".fsdp_modules(",
)  # fmt: skip
MIN_LINES, MAX_LINES = 10, 45


@dataclass
class Cell:
    """A listing cell run as written: its source, the listing it displays, the object listed (None for a
    file) and whether it asked for the docstring."""

    source: str
    listing: Listing
    obj: object
    docstring: bool


def _run_cell(source: str) -> Cell:
    """Run a listing cell as written; its last expression is the show_source/show_file call the page displays."""
    tree = ast.parse(source)
    last = tree.body.pop()
    assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call), (
        "a listing cell ends with the call"
    )
    namespace: dict = {}
    exec(compile(tree, "<cell>", "exec"), namespace)
    listing = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
    call = last.value
    obj = eval(compile(ast.Expression(call.args[0]), "<cell>", "eval"), namespace)
    docstring = any(k.arg == "docstring" and ast.literal_eval(k.value) for k in call.keywords)
    return Cell(source, listing, None if isinstance(obj, str) else obj, docstring)


def _listing_cells(nb_path) -> list[Cell]:
    cells = json.loads(nb_path.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return [_run_cell(src) for src in sources if re.search(r"\bshow_(source|file)\(", src)]


@pytest.fixture(scope="module")
def listings() -> dict[str, list[Cell]]:
    return {nb.stem: _listing_cells(nb) for nb in TEACHING}


def _fenced(markdown: str) -> str:
    """The code inside the listing's fence, as the page renders it."""
    m = re.search(r"^(`{3,})\w*\n(.*)\n\1$", markdown, re.S | re.M)
    assert m, markdown
    return m[2]


def _expected_source(obj, with_docstring: bool) -> str:
    """The object's lines in its file, dedented, without its own docstring (and the blank lines after it)
    unless asked: computed from the file's syntax tree, independently of ``show_source``."""
    lines, first = inspect.getsourcelines(obj)
    path = inspect.getsourcefile(obj)
    drop: set[int] = set()
    if not with_docstring:
        tree = ast.parse(open(path).read())
        node = next(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and (n.decorator_list[0].lineno if n.decorator_list else n.lineno) == first
        )
        doc = node.body[0]
        if (
            isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
        ):
            end = doc.end_lineno
            while end - first + 1 < len(lines) and not lines[end - first + 1].strip():
                end += 1  # the blank lines after it go too
            drop = set(range(doc.lineno, end + 1))
    kept = [line for i, line in enumerate(lines, start=first) if i not in drop]
    return textwrap.dedent("".join(kept)).rstrip("\n")


def test_every_teaching_chapter_shows_library_code(listings):
    assert [nb.stem[:2] for nb in TEACHING] == [f"0{i}" for i in range(8)]
    for stem, cells in listings.items():
        assert cells, f"{stem} shows no listing"
        calls = [c for cell in cells for c in API_CALLS if c in cell.listing.code]
        assert calls, f"{stem}: no listing calls torch/transformers/TRL/peft/accelerate"


def test_listing_cells_are_hidden_and_short(listings):
    for stem, cells in listings.items():
        for cell in cells:
            lst = cell.listing
            assert cell.source.startswith("#| echo: false\n"), f"{stem}: a listing cell shows its own code"
            low = MIN_LINES if cell.obj is not None else 1  # a config file is as long as it is
            assert low <= lst.n_lines <= MAX_LINES, f"{stem}: {lst.header} has {lst.n_lines} lines"


def test_each_listing_is_the_source_at_test_time(listings):
    """The rendered code block equals the object's lines in its file now (its docstring left out where the
    header says so); the header names the file and the lines ``inspect`` finds."""
    checked = 0
    for stem, cells in listings.items():
        for cell in cells:
            lst, obj = cell.listing, cell.obj
            shown = _fenced(lst._repr_markdown_())
            if obj is None:
                assert shown == (repo_root() / lst.path).read_text().rstrip("\n"), stem
                continue
            assert shown == _expected_source(obj, cell.docstring), f"{stem}: {lst.header}"
            lines, first = inspect.getsourcelines(obj)
            assert (lst.first_line, lst.last_line) == (first, first + len(lines) - 1)
            assert (repo_root() / lst.path).resolve() == Path(inspect.getsourcefile(obj)).resolve()
            assert ("docstring left out" in lst.header) == (not cell.docstring and obj.__doc__ is not None)
            checked += 1
    assert checked >= 8


def test_show_source_of_a_method_a_class_and_a_file():
    step = show_source(NativeTrainer.train_step)
    assert step.name == "NativeTrainer.train_step" and step.code.startswith("def train_step(self")
    assert step.path == "src/smolfsdp/train/native.py" and "self.optimizer.step()" in step.code
    assert '"""' not in step.code and "docstring left out" in step.header
    with_doc = show_source(fsdp2.apply_fsdp2, docstring=True)
    assert with_doc.code == textwrap.dedent(inspect.getsource(fsdp2.apply_fsdp2)).rstrip("\n")
    cls = show_source(Listing)
    assert cls.code.startswith("@dataclass(frozen=True, repr=False)\nclass Listing:")
    yaml = show_file("configs/accelerate/2gpu.yaml")
    assert yaml.language == "yaml" and "num_processes: 2" in yaml.code and yaml.first_line == 1
    assert yaml.markdown.startswith("**`configs/accelerate/2gpu.yaml`**, lines 1-")


def test_a_fence_is_longer_than_any_backtick_run_inside():
    lst = Listing("x.md", 1, 1, "markdown", "```python\nx = 1\n```")
    assert lst.markdown.splitlines()[2] == "````markdown" and lst.markdown.rstrip().endswith("\n````")


def test_nbconvert_renders_a_listing_as_highlighted_code():
    """What ``scripts/execute_notebooks.py`` writes: the Markdown output becomes a highlighted block (Quarto
    renders the same Markdown as its own highlighted code block)."""
    lst = show_source(fsdp2.apply_fsdp2)
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("show_source(apply_fsdp2)")
    cell.outputs = [
        nbformat.v4.new_output("display_data", {"text/markdown": lst.markdown, "text/plain": repr(lst)})
    ]
    nb.cells = [cell]
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert '<div class="highlight' in html or 'class="highlight' in html
    assert "fully_shard" in html and "src/smolfsdp/sharding/fsdp2.py" in html


def _bash_commands(markdown: str) -> list[str]:
    """The command lines of the first ```bash block: continuations joined, comments and blank lines dropped."""
    block = re.search(r"```bash\n(.*?)```", markdown, re.S)[1]
    joined = re.sub(r"\\\n\s*", "", block)
    return [
        " ".join(line.split())
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_chapter_01_gives_the_readmes_two_gpu_commands():
    readme = (repo_root() / "README.md").read_text()
    section = readme[readme.index("## The real run: SmolLM3-3B on two GPUs") :]
    wanted = [c for c in _bash_commands(section) if c.startswith(".venv/bin/smolfsdp")]
    nb = json.loads((repo_root() / "notebooks" / "01_finetune.ipynb").read_text())
    md = next(
        "".join(c["source"]) for c in nb["cells"] if "## Running it on two GPUs" in "".join(c["source"])
    )
    assert _bash_commands(md) == wanted
    assert wanted == [
        ".venv/bin/smolfsdp train --config configs/runs/smollm3_3b_medical.yaml",
        ".venv/bin/smolfsdp train --config configs/runs/smollm3_3b_medical.yaml "
        "--accelerate_config configs/accelerate/2gpu.yaml",
    ]
    # before the smoke run, as a reader meets the chapter
    sources = ["".join(c["source"]) for c in nb["cells"]]
    two_gpu = next(i for i, s in enumerate(sources) if "## Running it on two GPUs" in s)
    assert two_gpu < next(i for i, s in enumerate(sources) if "runner.run(cfg" in s)
