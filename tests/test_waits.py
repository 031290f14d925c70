"""Issue 33: the Makefile's long waits say what they wait on before they start (no silent minutes)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> list[str]:
    """The shell lines ``make -n`` would run for ``target`` as if nothing were built yet."""
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "-C", str(ROOT), target],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_make_venv_says_what_it_installs_and_how_long_before_pip():
    lines = _recipe("venv")
    first_pip = next(i for i, ln in enumerate(lines) if "pip install --quiet" in ln)
    said = " ".join(ln for ln in lines[:first_pip] if ln.startswith("echo"))
    assert "installing the pinned packages" in said and "about 2-3 minutes" in said
    assert lines[-1].startswith("echo") and "ready" in lines[-1]


def test_make_test_says_collection_takes_a_while_before_pytest():
    lines = _recipe("test")
    pytest_at = next(i for i, ln in enumerate(lines) if "-m pytest" in ln)
    assert "collecting the tests" in lines[pytest_at - 1] and lines[pytest_at - 1].startswith("echo")
