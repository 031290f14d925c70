"""scripts/dryrun_grid.py --reestimate: prints old vs new estimate per changed row and writes only with --write."""

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "data" / "results" / "dryrun" / "grid.json"


def _script():
    spec = importlib.util.spec_from_file_location("dryrun_grid", ROOT / "scripts" / "dryrun_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reestimate_prints_the_change_and_writes_only_when_asked(tmp_path, capsys):
    path = tmp_path / "grid.json"
    shutil.copy(GRID, path)
    grid = json.loads(path.read_text())
    first = grid["runs"][0]
    peak = next(r for r in first["estimate_vs_dry_run"] if r["component"].startswith("peak"))
    true_gib = peak["estimate_gib"]
    peak["estimate_gib"] = 1.0  # a stale committed estimate
    path.write_text(json.dumps(grid, indent=1) + "\n")
    before = path.read_text()

    lines = _script().reestimate(path)
    assert path.read_text() == before  # no --write: the file is left as it was
    changed = [ln for ln in lines if ln.startswith(first["label"] + " | peak")]
    assert len(changed) == 1 and f"estimate     1.000 -> {true_gib:9.3f} GiB" in changed[0]
    assert lines[-2].startswith("1 estimate(s) changed over 48 setups")
    assert "left as it was (--write rewrites its estimates)" in lines[-1]
    assert capsys.readouterr().out.splitlines() == lines

    lines = _script().reestimate(path, write=True)
    after = json.loads(path.read_text())
    new_peak = next(r for r in after["runs"][0]["estimate_vs_dry_run"] if r["component"].startswith("peak"))
    assert abs(new_peak["estimate_gib"] - true_gib) < 1e-9 and "estimated" in after["provenance"]
    assert lines[-1] == f"wrote the new estimates -> {path}"
