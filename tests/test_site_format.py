"""What the site prints of the dry-run grid (chapter 00): no negative zero, and a provenance line that says
whether the grid is current (smolfsdp.book.dryrun_views.signed, currency_line)."""

import subprocess

from smolfsdp.book import dryrun_views as dv


def test_signed_never_prints_a_negative_zero():
    assert [dv.signed(v, 2) for v in (-0.001, -0.0, 0.004, -0.4, 0.095, 12.3456)] == [
        "0.00", "0.00", "0.00", "-0.40", "+0.10", "+12.35",
    ]  # fmt: skip
    assert dv.signed(-0.04, 1) == "0.0" and dv.signed(-0.06, 1) == "-0.1"


def test_committed_grid_tables_show_no_negative_zero():
    grid = dv.load_grid()
    cells = [*dv.error_pivot(grid).to_numpy().ravel(), *dv.grid_table(grid)["error"]]
    assert not [c for c in cells if str(c).startswith(("-0.0 ", "-0.00"))]
    assert "0.00" in cells or "0.0 %" in cells  # the grid has errors that round to zero: shown unsigned


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_provenance_says_whether_the_grid_is_current(tmp_path):
    """Unchanged traced code since the grid's commit: 'current'; a traced file changed: how many and what
    still checks the rows; a commit git does not know (shallow clone): it says it cannot tell."""
    (tmp_path / "src" / "smolfsdp" / "audit" / "dryrun").mkdir(parents=True)
    traced = tmp_path / "src" / "smolfsdp" / "audit" / "dryrun" / "run.py"
    traced.write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "grid", "--allow-empty")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    grid = {"provenance": {"git_sha": sha}, "runs": [{"label": "a"}]}
    assert dv.currency_line(grid, tmp_path).startswith("The grid is current: the code it traced")
    (tmp_path / "src" / "smolfsdp" / "book.py").write_text("untraced\n")  # not traced code: still current
    assert dv.currency_line(grid, tmp_path).startswith("The grid is current")
    traced.write_text("x = 2\n")
    line = dv.currency_line(grid, tmp_path)
    assert line.startswith("The traced code changed since in 1 file (run.py)") and "dryrun_grid.py" in line
    missing = {"provenance": {"git_sha": "0" * 40}, "runs": [{"label": "a"}]}
    assert dv.currency_line(missing, tmp_path).startswith(
        "Whether the traced code changed since can not be told"
    )


def test_long_names_in_table_cells_get_break_points_only_there():
    """finish_site's pass: a <wbr> inside a cell's long names (camel humps, after '_' and '.'), none in numbers,
    tags, attributes or text outside tables; a second pass adds nothing."""
    import importlib.util

    from smolfsdp.paths import repo_root

    spec = importlib.util.spec_from_file_location("rb", repo_root() / "scripts" / "render_book.py")
    rb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rb)
    html = ('<p>SmolLM3DecoderLayer</p><td class="a_b">SmolLM3DecoderLayer <code>apply_lora</code> 6.6951 '
            "torch.bfloat16</td>")  # fmt: skip
    once = rb.break_long_names(html)
    assert once == ('<p>SmolLM3DecoderLayer</p><td class="a_b">SmolLM3<wbr>Decoder<wbr>Layer <code>apply_<wbr>lora'
                    "</code> 6.6951 torch.<wbr>bfloat16</td>")  # fmt: skip
    assert rb.break_long_names(once) == once
