"""`make book`'s execution (``smolfsdp.book.chapters.execute_chapter``): it says which chapter and cell is
running, and the kernel starts without ipykernel's TCP warning (issue 17), on a three-cell notebook."""

import nbformat

from smolfsdp.book.chapters import PARAMETERS_TAGS, execute_chapter


def _notebook(path):
    params = nbformat.v4.new_code_cell('#| label: parameters\n#| echo: false\nPROFILE = "smoke"')
    params.metadata["tags"] = list(PARAMETERS_TAGS)
    cells = [
        nbformat.v4.new_markdown_cell("# A chapter {#sec-x}"),
        params,
        nbformat.v4.new_code_cell("#| label: fig-answer\nanswer = 6 * 7"),
        nbformat.v4.new_code_cell("print(PROFILE, answer)"),
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)


def test_progress_names_chapter_and_cell_and_kernel_warns_nothing(tmp_path, capfd):
    nb_path = tmp_path / "03_demo.ipynb"
    _notebook(nb_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    nb = execute_chapter(nb_path, "full", progress=True)
    err = capfd.readouterr().err
    # papermill's injected cell runs too: 4 code cells, the running one named by its label or first line
    assert nb.cells[-1].outputs[0]["text"] == "full 42\n"
    assert "03_demo" in err and "4/4" in err
    assert "cell 4/5: fig-answer" in err and "cell 5/5: print(PROFILE, answer)" in err
    # the kernel's stderr is this process's: ipykernel says nothing about TCP (it runs over IPC)
    assert "TCP" not in err and "WARNING" not in err, err
    # no socket file left beside the notebook (the kernel's working directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_no_progress_bar_unless_asked(tmp_path, capfd):
    nb_path = tmp_path / "04_quiet.ipynb"
    _notebook(nb_path)
    execute_chapter(nb_path, "smoke")
    assert "04_quiet" not in capfd.readouterr().err
