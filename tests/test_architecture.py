"""The package's shape: layers (import-linter), no import cycles (grimp), imports at the top, sizes.

The layers and what each subpackage holds: README.md "Layout" and each ``__init__.py``. The contract
itself is ``[tool.importlinter]`` in pyproject.toml; ``lint-imports`` is run here so the README's test
command enforces it.
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "smolfsdp"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _env() -> dict[str, str]:
    """This checkout's ``src`` first, so the linter reads these files and not an installed copy."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    return env


def _modules() -> list[tuple[str, ast.Module, list[str]]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        out.append((path.relative_to(PACKAGE).as_posix(), ast.parse(text), text.splitlines()))
    return out


def _functions(tree: ast.Module):
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_lint_imports_contracts_are_kept():
    """``lint-imports`` (import-linter 2.5) with pyproject's contracts: no layer imports one above it,
    siblings marked ``|`` import neither way, and every subpackage is placed in a layer."""
    linter = Path(sys.executable).with_name("lint-imports")
    assert linter.is_file(), f"{linter} is missing: pip install -c constraints.txt -e '.[dev]'"
    proc = subprocess.run(
        [str(linter), "--no-cache"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 1 kept, 0 broken." in proc.stdout


def test_lint_imports_refuses_an_upward_import(tmp_path):
    """The contract is live: a copy of the package where a low layer (estimate) imports a high one
    (train) is refused, naming the import."""
    shutil.copytree(PACKAGE, tmp_path / "smolfsdp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = tmp_path / "smolfsdp" / "estimate" / "hardware.py"
    bad.write_text(bad.read_text() + "\nfrom smolfsdp.train import sft  # noqa: E402\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    linter = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(linter), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    assert "smolfsdp.estimate is not allowed to import smolfsdp.train" in proc.stdout
    assert "smolfsdp.estimate.hardware -> smolfsdp.train.sft" in proc.stdout


def test_the_estimator_never_imports_the_audit():
    """The checks of the project's numbers (``smolfsdp.audit``) sit above the estimator they judge: no module of
    ``estimate``, ``measure``, ``train`` or ``sharding`` imports it (the contract's layers say so too)."""
    sys.path.insert(0, str(SRC))
    try:
        graph = grimp.build_graph("smolfsdp", cache_dir=None)
    finally:
        sys.path.remove(str(SRC))
    for low in ("smolfsdp.estimate", "smolfsdp.measure", "smolfsdp.train", "smolfsdp.sharding"):
        assert not graph.chain_exists(importer=low, imported="smolfsdp.audit", as_packages=True), low


def test_no_module_file_name_is_used_twice():
    """Files are named for their subject, once: no two modules of the package share a file name (``__init__``
    aside), so a name in a traceback or a chapter points at one file."""
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(path.relative_to(PACKAGE).as_posix())
    assert {n: p for n, p in names.items() if len(p) > 1} == {}


def test_no_import_cycles_inside_any_package():
    """No cycle among the modules of any subpackage (nor among the subpackages): grimp, the graph
    library import-linter is built on, nominates no import to break."""
    sys.path.insert(0, str(SRC))
    try:
        graph = grimp.build_graph("smolfsdp", cache_dir=None)
    finally:
        sys.path.remove(str(SRC))
    assert graph.find_modules_directly_imported_by("smolfsdp.launch.runner")  # really this checkout's graph
    packages = ["smolfsdp"] + sorted(m for m in graph.modules if m.count(".") == 1 and graph.find_children(m))
    cycles = {pkg: graph.nominate_cycle_breakers(pkg) for pkg in packages}
    assert {pkg: breakers for pkg, breakers in cycles.items() if breakers} == {}


def _function_imports(tree: ast.Module, lines: list[str]):
    """``(line, module, commented)`` for every import inside a function."""
    for fn in _functions(tree):
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                text = " ".join(lines[node.lineno - 1 : node.end_lineno])
                yield node.lineno, module or "", "#" in text


def test_no_function_level_imports_of_our_own_modules():
    """Our own modules are imported at the top of a module: an import inside a function hid the
    cycles this layout removed. (A commented deferral is allowed.)"""
    found = [
        f"{name}:{line} {module}"
        for name, tree, lines in _modules()
        for line, module, commented in _function_imports(tree, lines)
        if module.startswith("smolfsdp") and not commented
    ]
    assert found == []


def test_every_function_level_import_says_why():
    """An import inside a function defers a heavy optional dependency, and its line says so."""
    found = [
        f"{name}:{line} {module}"
        for name, tree, lines in _modules()
        for line, module, commented in _function_imports(tree, lines)
        if not commented
    ]
    assert found == []


def test_no_module_over_400_lines():
    long = {name: len(lines) for name, _, lines in _modules() if len(lines) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_over_80_lines():
    long = {
        f"{name}:{fn.name}": fn.end_lineno - fn.lineno + 1
        for name, tree, _ in _modules()
        for fn in _functions(tree)
        if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long == {}
