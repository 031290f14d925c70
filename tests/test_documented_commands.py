"""Following the docs never breaks the main job (issue 17).

Every command the README and the chapters document is parsed from them (so a newly documented command
is covered without editing this file), then run in document order on one fresh copy of the repository,
then ``make demo``'s command (read from the Makefile). The tests check that each succeeded, that no
command wrote into a run folder another one made (except a resume of that run), that every final
model written is still there with the same bytes at the end, and that the demo, LoRA and TRL runs
print no third-party warning line.

Where commands come from:

* Markdown: every line of a fenced ``bash`` block (``\\`` continuations joined, ``#`` comments
  dropped), and inline code spans that start with ``smolfsdp``/``.venv/bin/smolfsdp`` and give
  arguments, with ``make <target>``, or run a script of ``scripts/``. README first, then the chapters in book order.
* Notebook code cells: ``!`` shell lines.

Not every documented command can run here (no GPU, no Hub, one node): ``NOT_HERE`` names each kind
with the reason, and ``test_commands_not_run_here_are_named_with_a_reason`` lists them, so nothing is
left out silently. Placeholders are filled where the docs' own runs provide a value (``PLACEHOLDERS``);
``[...]`` marks optional arguments and is left out.

This is the slowest test file of the CPU suite (every documented training run, ~15 launches of 2 to 4
processes): the commands are run exactly as documented, with their own settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_quiet import third_party_warning_lines

from smolfsdp.book.chapters import chapters

# ~12 minutes on the 2-core CI machine (about 17 launched runs): outside the default suite, which the CI
# time budget (~40 min) holds; run it with `pytest -m slow tests/test_documented_commands.py`. The default
# suite keeps test_quiet's warning counts on the demo, LoRA and TRL runs.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MEDQUAD = ROOT.parent / "shared" / "data" / "medquad_cancergov_niddk.jsonl"

#: Documented commands that cannot run on this machine, by pattern, with the reason (checked in order).
NOT_HERE = (
    (r"^make (test|venv)\b", "sets up or runs the whole suite; the suite itself is what runs this test"),
    (r"^make render\b", "needs Quarto, which cannot be installed here (DESIGN.md, platform facts)"),
    (r"^make book\b", "executes every chapter (~13 min); tests/test_notebooks.py does that"),
    (r"smollm3_3b_medical|accelerate launch", "the real run: SmolLM3-3B from the Hub on CUDA GPUs"),
    (r"\bsbatch\b", "needs a SLURM cluster"),
    (r"--nnodes", "needs several nodes (tests/test_faults.py runs the multi-node path on one machine)"),
    (r"gpu_check\.sh", "needs a CUDA GPU (tests/test_gpu_check.py runs its --simulate-cpu mode)"),
    (r"/path/to/", "a data file of the reader's (filled with ../shared/data's MedQuAD rows where present)"),
    (
        r"(^|\s)(\.\.\.|NAME|N)(\s|$)|\$\w+|<[^>]*>",
        "elided arguments or a placeholder the docs' runs do not provide",
    ),
)
#: Placeholders the docs' own runs fill: a glob over the copy's run folders (newest match), or a path.
PLACEHOLDERS = {
    # the README's step-<N> is a step the run kept (save_total_limit keeps the newest 2)
    "runs/<name>/checkpoints/step-<N>": "runs/*/checkpoints/step-*",
    "runs/<name>/traces/<trace>.json.gz": "runs/*/traces/*.json.gz",
    "/tmp/exported": "{tmp}/exported",
    "/path/to/medquad.jsonl": str(MEDQUAD),
}
SMOLFSDP = re.compile(r"^(\.venv/bin/)?smolfsdp(?=\s)")


@dataclass
class Documented:
    source: str  # "README.md" or "notebooks/06_gotchas.ipynb"
    text: str  # as written, continuations joined, comment dropped
    resolved: str = ""  # the text after placeholders and optional arguments
    argv: list[str] | None = None  # what runs; None when it cannot run here
    why_not: str = ""
    rc: int | None = None
    log: str = ""
    seconds: float = 0.0
    wrote: list[str] = field(default_factory=list)  # run folders created or changed


# ------------------------------------------------------------------------------ parsing the docs
def _shell_lines(block: str) -> list[str]:
    """The commands of a bash block: continuations joined, comments and blank lines dropped."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(" ".join(words))
    return out


def _markdown_commands(text: str) -> list[str]:
    """Fenced bash lines and runnable inline spans of a markdown text, in the order they appear."""
    found = [
        (m.start(), cmd) for m in re.finditer(r"```bash\n(.*?)```", text, re.S) for cmd in _shell_lines(m[1])
    ]
    for m in re.finditer(r"`([^`\n]*(?:\n[^`\n]*)?)`", text):
        span = " ".join(m[1].split())
        smol = SMOLFSDP.match(span) and len(span.split()) > 2
        script = re.match(r"(OUT=(<[^>]*>|\S+) )?(bash|python3?) scripts/", span)
        if smol or script or re.fullmatch(r"make [a-z]+( [A-Z_]+=\S+)*", span):
            found.append((m.start(), span))
    return [cmd for _, cmd in sorted(found, key=lambda f: f[0])]  # stable: a block keeps its order


def documented_commands() -> list[Documented]:
    """Every documented command, README first, then the chapters in book order; each once."""
    sources = [("README.md", (ROOT / "README.md").read_text())]
    for nb in chapters():
        cells = json.loads(nb.read_text())["cells"]
        text = ""
        for cell in cells:
            src = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                text += src + "\n"
            elif cell["cell_type"] == "code":
                text += "".join(f"```bash\n{ln[1:]}\n```\n" for ln in src.splitlines() if ln.startswith("!"))
        sources.append((str(nb.relative_to(ROOT)), text))
    seen, out = set(), []
    for source, text in sources:
        for cmd in _markdown_commands(text):
            if cmd not in seen:
                seen.add(cmd)
                out.append(Documented(source, cmd))
    return out


def make_demo_command() -> str:
    """The command of the Makefile's ``demo`` target, ``$(BIN)/`` as ``.venv/bin/``."""
    recipe = re.search(r"^demo:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M)[1]
    return recipe.replace("$(BIN)/", ".venv/bin/")


def resolve(cmd: Documented, copy: Path, tmp: Path, demo: str) -> Documented:
    """Fill ``cmd.argv`` (this interpreter, the copy's sources) or ``cmd.why_not``."""
    text = re.sub(r"\s*\[[^\]]*\]", "", cmd.text)  # optional arguments
    if text == "make demo":
        text = demo
    for placeholder, value in PLACEHOLDERS.items():
        if placeholder in text:
            if "*" in value:
                hits = sorted(copy.glob(value), key=lambda p: p.stat().st_mtime)
                value = str(hits[-1].relative_to(copy)) if hits else placeholder
            value = value.format(tmp=tmp)
            if value.startswith("/") and not Path(value).parent.exists():
                value = placeholder  # e.g. ../shared absent on a fresh clone
            text = text.replace(placeholder, value)
    cmd.resolved = text
    for pattern, why in NOT_HERE:
        if re.search(pattern, text):
            cmd.why_not = why
            return cmd
    if not SMOLFSDP.match(text):
        cmd.why_not = "not a smolfsdp or make command this test knows how to run"
        return cmd
    cmd.argv = [sys.executable, "-m", "smolfsdp.cli", *shlex.split(SMOLFSDP.sub("", text))]
    return cmd


# ------------------------------------------------------------------------------ running them
def _fingerprint(run: Path) -> dict[str, str]:
    """SHA-256 of every file of a run folder except logs and the lock (what a later run must not change)."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.suffix not in (".lock", ".log")
    }


def _runs(copy: Path) -> dict[str, dict[str, str]]:
    return {p.name: _fingerprint(p) for p in sorted((copy / "runs").glob("*")) if p.is_dir()}


@pytest.fixture(scope="module")
def documented(tmp_path_factory):
    """Every documented command, then the demo's, run in order on one copy of the repository."""
    tmp = tmp_path_factory.mktemp("docs")
    copy = tmp / "repo"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    demo = make_demo_command()
    commands = documented_commands() + [Documented("Makefile (make demo, last)", demo)]
    finals: dict[str, dict[str, str]] = {}  # run -> fingerprint of its final_model, as its owner left it
    owners: dict[str, Documented] = {}  # run -> the first command that wrote it
    clashes = []
    for cmd in commands:
        resolve(cmd, copy, tmp, demo)
        if cmd.argv is None:
            continue
        before, t0 = _runs(copy), time.monotonic()
        proc = subprocess.run(cmd.argv, cwd=copy, env=env, capture_output=True, text=True, timeout=900)
        cmd.rc, cmd.log, cmd.seconds = proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0
        print(f"[documented] exit {cmd.rc} in {cmd.seconds:.0f} s: {cmd.text}", file=sys.stderr, flush=True)
        after = _runs(copy)
        cmd.wrote = [name for name, files in after.items() if before.get(name) != files]
        for name in cmd.wrote:
            owner = owners.setdefault(name, cmd)
            if not _may_rewrite(cmd, owner):
                clashes.append(
                    f"runs/{name}: written by {owner.text!r} and again by {cmd.text!r} ({cmd.source})"
                )
                continue
            final = {k: v for k, v in after[name].items() if k.startswith("final_model/")}
            if final:
                finals[name] = final
    return {"commands": commands, "finals": finals, "clashes": clashes, "end": _runs(copy)}


def _may_rewrite(cmd: Documented, owner: Documented) -> bool:
    """A run folder may be written again by the command that made it (run again, as ``make demo`` is
    at the end) or by a resume of it; by nothing else."""
    return cmd is owner or cmd.resolved == owner.resolved or bool(re.search(r"--resume(_from)?\b", cmd.text))


def _ran(documented) -> list[Documented]:
    return [c for c in documented["commands"] if c.argv is not None]


def test_the_docs_document_the_commands_a_newcomer_runs():
    """The parser finds the main kinds (a check on the parser, not on the runs)."""
    texts = [c.text for c in documented_commands()]
    assert texts[0] == "make demo"
    assert any(t.startswith(".venv/bin/smolfsdp train --config configs/runs/lora_smoke.yaml") for t in texts)
    assert any(t.startswith("smolfsdp memory --model smollm3-3b") for t in texts)
    assert any("--stop_at_step 3" in t for t in texts)  # chapter 06's resume drill
    assert "OUT=<empty folder> bash scripts/gpu_check.sh" in texts
    gotcha = resolve(Documented("x", "smolfsdp gotchas --run NAME"), ROOT, ROOT, "")
    assert gotcha.argv is None and "placeholder" in gotcha.why_not
    assert make_demo_command() == ".venv/bin/smolfsdp train --config configs/runs/smoke.yaml"
    assert _shell_lines("a \\\n  b  # note\n# only a comment\n") == ["a b"]


def test_commands_not_run_here_are_named_with_a_reason(documented):
    skipped = [c for c in documented["commands"] if c.argv is None]
    for c in skipped:
        assert c.why_not, c
    print("\n".join(f"not run here: {c.text}  ({c.why_not}; {c.source})" for c in skipped))
    assert len(_ran(documented)) >= 10  # most of what the docs ask a newcomer to run does run here


def test_every_documented_command_succeeds(documented):
    failed = [f"{c.source}: {c.text} -> exit {c.rc}\n{c.log[-2000:]}" for c in _ran(documented) if c.rc != 0]
    print("\n".join(f"{c.seconds:6.1f} s  {c.text}" for c in _ran(documented)))
    assert not failed, "\n\n".join(failed)


def test_no_run_folder_is_written_by_two_commands(documented):
    """A run name belongs to one documented command; only a resume of that run may write it again."""
    assert not documented["clashes"], "\n".join(documented["clashes"])


def test_every_final_model_is_still_there_unchanged(documented):
    end = documented["end"]
    assert documented["finals"], "no documented run wrote a final model"
    for name, files in documented["finals"].items():
        now = {k: v for k, v in end.get(name, {}).items() if k.startswith("final_model/")}
        assert now == files, f"runs/{name}/final_model was deleted or overwritten by a later command"


@pytest.mark.parametrize(
    "wanted",
    [
        r"^make demo$|^\.venv/bin/smolfsdp train --config configs/runs/smoke\.yaml$",  # first and last
        r"lora_smoke\.yaml$",
        r"smoke_trl\.yaml",
    ],
    ids=["make demo", "lora", "trl"],
)
def test_demo_lora_and_trl_runs_print_no_third_party_warnings(documented, wanted):
    runs = [c for c in _ran(documented) if re.search(wanted, c.text)]
    assert runs, f"no documented command matches {wanted}"
    for c in runs:
        assert third_party_warning_lines(c.log) == [], c.text
