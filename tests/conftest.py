import hashlib
import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from smolfsdp.launch.processes import stop_on_signals  # noqa: E402  (after the environment above; no torch)

# SIGTERM or Ctrl-C to pytest (`make test`) stops every process a test launched (torchrun, its ranks, a
# CLI run, a kernel), then ends the session as after Ctrl-C: none is left running (tests/test_stop.py)
stop_on_signals()

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MEDQUAD = SHARED / "data" / "medquad_cancergov_niddk.jsonl"


#: Test files that share the session fixture ``executed`` (every chapter executed once, ~25 min here).
BOOK_FILES = ("test_notebooks", "test_site")


#: The next longest files (fresh-clone run, 2026-12-03): queued right after the book, so neither worker ends
#: alone on a long file (test_dryrun last made one worker run ~8 min after the other had finished).
LONG_FILES = ("test_dryrun", "test_hsdp")


def pytest_collection_modifyitems(config, items):
    """The book files first, then :data:`LONG_FILES`: under ``make test``'s two workers they are the longest
    groups (see below); the other files keep their order."""
    items.sort(
        key=lambda item: (item.module.__name__ not in BOOK_FILES, item.module.__name__ not in LONG_FILES)
    )


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; without xdist (-p no:xdist) it is never called
def pytest_xdist_make_scheduler(config, log):
    """``make test``'s ``pytest -n 2``: each test file runs whole on one worker (xdist's ``--dist loadfile``: its
    module fixtures are built once), and the two book files are one unit, so the chapters execute once.
    Our own scheduler because xdist 3.8's ``--dist loadgroup`` renames ``item._nodeid``, which pytest 9.2's
    nodes no longer read (``Node.nodeid`` is ``str(self._id)``): its groups are silently ignored."""
    from xdist.scheduler import LoadFileScheduling  # deferred: only under pytest -n

    class BookTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "book" if Path(file).stem in BOOK_FILES else file

    return BookTogether(config, log)


@pytest.fixture(scope="session")
def tokenizer():
    from smolfsdp.models.modeling import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One folder for a test module's runs, shared by its tests (a run and its resumed copy live side by side)."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def uninterrupted(request, runs):
    """The test module's ``BASE`` (a TrainConfig) run whole, once per module, as ``whole``: what the
    interrupted and resumed runs of that module are compared with."""
    from smolfsdp.launch import runner  # after the environment above is set, like every smolfsdp import here

    return runner.run(
        request.module.BASE.replace(name="whole", output_dir=str(runs)), capture=True, timeout=600
    )


@pytest.fixture
def medquad_path():
    if not MEDQUAD.is_file():
        pytest.skip(
            f"{MEDQUAD} is absent: the real MedQuAD rows live in ../shared/data/ (CI has them; a fresh "
            "clone does not)"
        )
    return MEDQUAD


def tracked_changes() -> dict[str, str] | None:
    """A digest of every tracked file's bytes in the working tree (None outside a git checkout).

    Compared before and after: unlike `git status`, it ignores commits made meanwhile.
    """
    try:
        files = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    return {
        f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest() if (ROOT / f).is_file() else "missing"
        for f in files
        if f
    }


def changed(before: dict | None, after: dict | None) -> list[str]:
    """Tracked files whose bytes differ between two :func:`tracked_changes` (none outside git)."""
    if before is None or after is None:
        return []
    return sorted(f for f in before.keys() | after.keys() if before.get(f) != after.get(f))


@pytest.fixture(scope="session")
def executed(tmp_path_factory):
    """Every chapter executed ONCE in the smoke profile (parameters injected through papermill, as
    ``quarto render -P`` injects them): ``(notebooks by stem, nbconvert HTML folder, (tracked digests
    before, after))``. tests/test_notebooks.py checks the notebooks and the HTML; tests/test_site.py renders
    these same notebooks with ``quarto render --no-execute``. SMOLFSDP_CHAPTERS=00_memory,04_lora_fsdp2 runs
    a few chapters while working on them; CI runs all."""
    from smolfsdp.book.chapters import execute_chapter, select_chapters

    html_dir = tmp_path_factory.mktemp("html")
    before = tracked_changes()
    names = [n for n in os.environ.get("SMOLFSDP_CHAPTERS", "").split(",") if n]
    notebooks = {nb.stem: execute_chapter(nb, "smoke", html_dir) for nb in select_chapters(names)}
    return notebooks, html_dir, (before, tracked_changes())
