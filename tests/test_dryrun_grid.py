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


SHAPES = ROOT / "data" / "results" / "dryrun" / "shapes.json"


def test_estimator_holds_on_the_committed_shapes_grid():
    """Every setup of data/results/dryrun/shapes.json (SmolLM3-3B, Llama 3.2 1B, Qwen2.5-1.5B, Llama 3.1 8B;
    2 x 128 and 2 x 2048 tokens) re-estimated from its traced bytes (seconds, no dry run): parameters, gradients
    and AdamW state byte for byte, the peak within 3 % of the traced one."""
    from smolfsdp.audit.dryrun.compare import compare_committed

    grid = json.loads(SHAPES.read_text())
    assert "not measured on a GPU" in grid["provenance"]["what"] and grid["provenance"]["complete"]
    runs = grid["runs"]
    models = {r["label"].split(" FSDP")[0] for r in runs}
    assert models == {"SmolLM3-3B", "Llama-3.2-1B", "Qwen2.5-1.5B", "Llama-3.1-8B"} and len(runs) == 24
    # FSDP1 LoRA in both layouts (adapter-units: each adapter its own unit, no base gradient)
    units = [r for r in runs if r["setup"].get("lora_layout") == "adapter-units"]
    assert len(units) == 2 and {r["setup"]["max_length"] for r in units} == {128, 2048}
    for model in models - {"SmolLM3-3B"}:  # SmolLM3-3B's long sequences: the 48 setups of grid.json
        assert {r["setup"]["max_length"] for r in runs if r["label"].startswith(model)} == {128, 2048}, model
    assert {r["setup"]["fsdp_version"] for r in runs} == {1, 2} and {r["setup"]["lora"] for r in runs} == {
        False,
        True,
    }
    moments, worst = set(), 0.0
    for row in runs:
        records = compare_committed(row, ROOT).to_dict("records")
        table = {r["component"].split(" (")[0]: r for r in records}
        for name in ("parameters", "gradients", "optimizer state"):
            assert table[name]["error_pct"] == 0, (row["label"], name)
        assert abs(table["peak"]["error_pct"]) <= 3.0, (row["label"], table["peak"])
        moments.add(next(r["component"] for r in records if r["component"].startswith("peak")))
        worst = max(worst, abs(table["peak"]["error_pct"]))
    # the end of backward (the root's gradient, smolfsdp.estimate.root_grad) is the peak in some setups: tied, the
    # embedding's backward (three [V, h] at once); untied (Llama 3.1 8B), the root's reduce-scatter
    assert {"peak (embedding moment)", "peak (root reduce-scatter moment)"} <= moments, moments
    assert worst < 0.25, worst


def test_untied_root_gradient_during_the_layers_backward_is_the_output_layers():
    """Llama 3.1 8B (untied): while the decoder layers run backward the root's gradient is the output layer's
    and the final norm's (bf16); the embedding's comes last. Tied (SmolLM3-3B): the one shared weight's. The
    8B row that found it (FSDP2, 8 ranks, 2 x 128): the 'last layer' moment was one [V, h] too high, above the
    traced peak; now below it, and the peak is the root's reduce-scatter, byte for byte."""
    from smolfsdp.audit.dryrun.compare import compare_committed, estimate_for
    from smolfsdp.config import load_config
    from smolfsdp.estimate.params import model_units, resolve_model_config
    from smolfsdp.estimate.root_grad import root_grad_before_layers

    llama = resolve_model_config(str(ROOT / "data" / "models" / "llama3_1_8b"))
    v_h = llama.vocab_size * llama.hidden_size
    assert not llama.tie_word_embeddings and v_h == 128_256 * 4_096
    assert root_grad_before_layers(llama, 2 * v_h + 4_096, True, 2) == (v_h + 4_096) * 2
    assert root_grad_before_layers(llama, 2 * v_h + 4_096, False, 2) == 0  # LoRA: the root is frozen
    smol = resolve_model_config("HuggingFaceTB/SmolLM3-3B")
    root = sum(p.numel for p in model_units(smol)["root"])
    assert smol.tie_word_embeddings and root_grad_before_layers(smol, root, True, 2) == root * 2

    row = next(
        r
        for r in json.loads(SHAPES.read_text())["runs"]
        if r["label"] == "Llama-3.1-8B FSDP2 full AC on 2x128 W8"
    )
    peak = next(
        r for r in compare_committed(row, ROOT).to_dict("records") if r["component"].startswith("peak")
    )
    assert peak["component"] == "peak (root reduce-scatter moment)" and abs(peak["error_pct"]) < 1e-3, peak
    overrides = {**row["overrides"], "model": str(ROOT / row["overrides"]["model"])}
    est = estimate_for(load_config(ROOT / row["recipe"], **overrides), 8)
    assert est.moments["last layer"] < row["peak_bytes"] < est.moments["last layer"] + v_h * 2


def test_every_activation_checkpointing_row_of_the_grid_is_traced_again():
    """grid.json's provenance.retraced names every activation-checkpointing row (24 of 48): none holds the
    fake-only [B, 1, T, T] mask (smolfsdp.audit.dryrun.gpu_path); each names the commit that traced it."""
    grid = json.loads(GRID.read_text())
    ac = [r["label"] for r in grid["runs"] if r["overrides"]["activation_checkpointing"]]
    again = grid["provenance"]["retraced"]
    assert len(ac) == 24 and sorted(again["labels"]) == sorted(ac)
    assert all(r["git_sha"] for r in grid["runs"]) and len(again["git_sha"]) == 40
    assert all("series" in r for r in grid["runs"] if r["label"].startswith("book:"))  # the chapter's figure


def test_shapes_view_fits_the_page():
    from smolfsdp.book import dryrun_views, tables

    grid = dryrun_views.load_shapes()
    table = dryrun_views.shapes_table(grid)
    tables.show(table)  # raises when wider than the page
    assert len(table.columns) <= 7 and len(table) == len(grid["runs"])
    assert table["error"].str.endswith(" %").all()
    assert f"of {len(grid['runs'])} setups" in dryrun_views.shapes_reading(grid)
