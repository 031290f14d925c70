"""scripts/cell_times.py: the long code cells of executed chapters, and whether each printed as it ran (issue 33)."""

import importlib.util

import nbformat

from smolfsdp.paths import repo_root


def _script():
    spec = importlib.util.spec_from_file_location("cell_times", repo_root() / "scripts" / "cell_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(source: str, start: str, end: str, outputs: list) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source, outputs=outputs)
    cell.metadata["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
    return cell


def test_long_cells_listed_with_silent_or_streaming(tmp_path, capsys):
    stream = nbformat.v4.new_output("stream", name="stdout", text="[rank0] started\ntrain: 100%|\n")
    table = nbformat.v4.new_output("execute_result", data={"text/plain": "a table"}, execution_count=1)
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Chapter"),
        _cell("#| label: bench\nbenches = run()", "2026-12-03T13:00:00.000Z", "2026-12-03T13:01:30.500Z", [table]),
        _cell("run = runner.run(cfg)", "2026-12-03T13:01:31.000Z", "2026-12-03T13:02:01.000Z", [stream, table]),
        _cell("x = 1", "2026-12-03T13:02:01.000Z", "2026-12-03T13:02:01.200Z", []),
        nbformat.v4.new_code_cell("never ran"),  # no execution stamps: skipped
    ])  # fmt: skip
    script = _script()
    rows = script.cell_times(nb)
    assert [(r["cell"], r["code"], r["wall_s"], r["stream_lines"], r["silent"]) for r in rows] == [
        (1, "benches = run()", 90.5, 0, True),
        (2, "run = runner.run(cfg)", 30.0, 2, False),
        (3, "x = 1", 0.2, 0, True),
    ]
    nbformat.write(nb, tmp_path / "05_x.ipynb")
    assert script.main([str(tmp_path), "--fail"]) == 1  # a long silent cell
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "05_x  cell  1    90.5 s  SILENT                 benches = run()",
        "05_x  cell  2    30.0 s  streams (2 lines)      run = runner.run(cfg)",
    ]
    assert script.main([str(tmp_path / "05_x.ipynb"), "--over", "60"]) == 0  # listed, but no --fail
