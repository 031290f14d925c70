"""The full-size dry run (smolfsdp.audit.dryrun): fake tensors change nothing, and the estimator is held to it.

Each dry run makes its own fake process group, so each runs in a fresh process (spawn). A model of SmolLM3's
shape scaled down ("mid": 12 layers, hidden 512, vocabulary 8,192) allocates little, so it also runs on real
tensors: the same code, the same trackers, really allocating. One SmolLM3-3B run holds the estimator, the
communication model and the MFU's FLOP formula to what the real model and code trace.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest

from smolfsdp.config import load_config
from smolfsdp.estimate.adamw_step import traced_adamw
from smolfsdp.paths import repo_root

FULL, LORA = "configs/runs/smollm3_3b_medical.yaml", "configs/runs/lora_smollm3_3b.yaml"
GIB = 2**30


def _mid_config(folder) -> str:
    """SmolLM3-3B's config.json with a smaller geometry (same layer class, GQA, tied embeddings, NoPE layers)."""
    config = json.loads((repo_root() / "data/models/smollm3_3b/config.json").read_text())
    config.update(num_hidden_layers=12, layer_types=config["layer_types"][:12], hidden_size=512,
                  intermediate_size=2048, num_attention_heads=8, num_key_value_heads=4, vocab_size=8192,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2)  # fmt: skip
    config.pop("no_rope_layers", None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _dry(recipe: str, overrides: dict, fake: bool = True, world_size: int | None = None, adamw=None) -> dict:
    """In a fresh process: the dry run of ``recipe`` + ``overrides`` (``adamw``: the AdamW step, by default the
    engine's) and its comparison with the estimate; ``phase_peaks``: the most bytes alive in each phase."""
    import warnings

    warnings.filterwarnings("ignore")
    from smolfsdp.audit.dryrun.compare import compare_with_estimate
    from smolfsdp.audit.dryrun.dry_run import dry_run

    # unpacked unless asked: the 3B recipes pack, and on CPU in bf16 torch's masked SDPA allocates more than the
    # CUDA kernels the estimator counts (smolfsdp.estimate.packed); tests/test_packing.py holds the packed path
    cfg = load_config(repo_root() / recipe, **{"packing": False, **overrides})
    report = dry_run(cfg, world_size, fake=fake, adamw=adamw)
    return {**report.to_dict(), "table": compare_with_estimate(report, cfg).to_dict("records"),
            "phase_peaks": _phase_peaks(report.alloc_events)}  # fmt: skip


def _phase_peaks(events: list) -> dict[str, int]:
    """The most bytes alive within each phase of a traced step, from its allocation order (``("p", phase)``,
    ``("a", id, bytes, ...)``, ``("f", id)``: ``smolfsdp.audit.dryrun.tracker``)."""
    alive, sizes, peaks, phase = 0, {}, {}, None
    for e in events:
        if e[0] == "p":
            phase = e[1]
        elif e[0] == "a":
            sizes[e[1]] = e[2]
            alive += e[2]
        elif e[0] == "f":
            alive -= sizes.pop(e[1], 0)
        if phase is not None:
            peaks[phase] = max(peaks.get(phase, 0), alive)
    return peaks


def _run_all(jobs: list[tuple]) -> list[dict]:
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), max_tasks_per_child=1) as pool:
        return list(pool.map(_dry, *zip(*jobs, strict=True)))


@pytest.fixture(scope="module")
def mid(tmp_path_factory) -> str:
    return _mid_config(tmp_path_factory.mktemp("mid"))


def _row(result: dict, name: str) -> dict:
    return next(r for r in result["table"] if r["component"].startswith(name))


def test_fake_tensors_trace_what_real_tensors_allocate(mid):
    """The same step on real tensors and on fake ones: the same peak, at the same moment, the same bytes held."""
    setup = {"model": mid, "max_length": 512, "gradient_accumulation_steps": 2}
    jobs = [(LORA, setup, fake) for fake in (True, False)]
    fake, real = _run_all(jobs)
    assert abs(fake["peak_bytes"] - real["peak_bytes"]) <= 0.005 * real["peak_bytes"]
    assert fake["peak_moment"]["phase"] == real["peak_moment"]["phase"] == "backward"
    assert fake["held_bytes"] == real["held_bytes"]
    assert fake["collectives"] == real["collectives"]
    assert fake["flops_counted"] == real["flops_counted"] > 0


# (fsdp_version, lora, activation checkpointing, peak tolerance %): every axis of the estimator's moments
MID_GRID = [(1, False, False, 1.0), (2, False, True, 1.0), (2, True, False, 3.0), (2, True, True, 1.0),
            (1, True, False, 5.0), (1, True, True, 10.0)]  # fmt: skip


def test_estimator_is_held_to_the_dry_run(mid):
    """Static terms byte for byte, the peak at its moment within the stated tolerance (FSDP1 + LoRA is the
    loosest: its FlatParameter gradients of frozen weights are freed and reduced in an order not modelled)."""
    jobs = [(LORA, {"model": mid, "max_length": 512, "gradient_accumulation_steps": 1, "fsdp_version": v,
                    "lora": lora, "activation_checkpointing": ac}) for v, lora, ac, _ in MID_GRID]  # fmt: skip
    for (v, lora, ac, tol), result in zip(MID_GRID, _run_all(jobs), strict=True):
        for name in ("parameters", "gradients", "optimizer state"):
            assert _row(result, name)["error_pct"] == 0, (v, lora, ac, name)
        assert abs(_row(result, "peak")["error_pct"]) <= tol, (v, lora, ac, _row(result, "peak"))


def test_offload_and_accumulation(mid):
    """CPU offload: the host holds parameter shards, gradients and AdamW state to the byte as estimated, and the
    device's own peak (without them) is the estimate's; gradient accumulation: the last micro-batch's backward
    starts with every gradient shard held, as the estimate's loss moment says."""
    base = {"model": mid, "max_length": 512, "lora": False}
    offload, accumulate = _run_all([(LORA, {**base, "cpu_offload": True, "gradient_accumulation_steps": 1}),
                                    (LORA, {**base, "activation_checkpointing": False,
                                            "gradient_accumulation_steps": 2})])  # fmt: skip
    host, device = offload["table"]
    assert host["component"].startswith("host") and host["error_pct"] == 0
    assert offload["offload"]["host_bytes"] == sum(offload["held_bytes"].values())
    assert (
        offload["offload"]["device_peak_bytes"] < offload["peak_bytes"] - offload["offload"]["host_bytes"] / 2
    )
    assert abs(device["error_pct"]) <= 1.0, device
    assert accumulate["peak_moment"]["phase"] == "backward"
    assert abs(_row(accumulate, "peak")["error_pct"]) <= 1.0, _row(accumulate, "peak")


def _committed_grid() -> dict:
    from smolfsdp.book.dryrun_views import load_grid

    grid = load_grid()
    assert grid is not None, (
        "data/results/dryrun/grid.json is missing: python scripts/dryrun_grid.py makes it"
    )
    return grid


def test_estimator_holds_on_the_whole_committed_grid():
    """Every setup of the committed SmolLM3-3B grid against today's estimator (re-estimated from the traced
    bytes, seconds): parameters, gradients and AdamW state byte for byte, the peak at its moment within 3 %."""
    from smolfsdp.audit.dryrun.compare import compare_committed

    grid = _committed_grid()
    kinds = {(r["setup"]["fsdp_version"], r["setup"]["lora"], r["setup"]["activation_checkpointing"],
              r["setup"]["max_length"], r["setup"]["world_size"]) for r in grid["runs"]}  # fmt: skip
    assert len(kinds) == len(grid["runs"]) >= 36, (
        "the grid covers FSDP1/2 x full/LoRA x AC x 2048/4096 x W2/4/8"
    )
    for row in grid["runs"]:
        table = {
            r["component"].split(" (")[0]: r for r in compare_committed(row, repo_root()).to_dict("records")
        }
        for name in ("parameters", "gradients", "optimizer state"):
            assert table[name]["error_pct"] == 0, (row["label"], name)
        assert abs(table["peak"]["error_pct"]) <= 3.0, (row["label"], table["peak"])


#: the setups CI traces again at full size: every axis (FSDP1 and FSDP2, full and LoRA, checkpointing on and
#: off, 2048 and 4096 tokens, 2, 4 and 8 ranks) at least once, the slow FSDP1 + LoRA kind left to the script
CI_SUBSET = ["FSDP2 full AC off 2x2048 W2", "FSDP2 LoRA AC on 2x4096 W8", "FSDP2 LoRA AC off 2x2048 W4",
             "FSDP2 full AC on 2x4096 W8", "FSDP1 full AC off 2x4096 W4"]  # fmt: skip


def native_loss(row: dict) -> dict:
    """The override that traces a committed row's loss again: transformers' (the native engine) for rows traced
    before the dry run took TRL's fused LM head (their setup has no ``loss_path``)."""
    return {} if "loss_path" in row["setup"] else {"engine": "native"}


def test_trl_fused_lm_head_is_traced_and_estimated(mid):
    """A TRL-engine recipe is traced through TRL's fused LM head (as SFTTrainer patches the model, its tiles
    allocating as the Triton kernels do): no [tokens, vocab] logits. Without checkpointing the loss moment is the
    peak; traced and estimated agree within 1 % on both loss paths, and so does the difference between them."""
    setup = {
        "model": mid,
        "max_length": 1024,
        "gradient_accumulation_steps": 1,
        "activation_checkpointing": False,
    }
    trl, hf = _run_all([(FULL, setup), (FULL, {**setup, "engine": "native"})])
    assert (trl["setup"]["loss_path"], hf["setup"]["loss_path"]) == ("trl-fused-lm-head", "transformers")
    for r in (trl, hf):
        assert r["peak_moment"]["phase"] == "backward", r["peak_moment"]
        assert abs(_row(r, "peak")["error_pct"]) <= 1.0, _row(r, "peak")
    traced = hf["peak_bytes"] - trl["peak_bytes"]
    estimated = (_row(hf, "peak")["estimate_gib"] - _row(trl, "peak")["estimate_gib"]) * GIB
    # 66 MiB traced, 64 estimated here (the estimate counts every token; TRL scores tokens x (sequence - 1))
    assert traced > 0.05 * hf["peak_bytes"] and abs(estimated - traced) <= 0.005 * hf["peak_bytes"], (
        traced,
        estimated,
    )


def test_the_book_recipe_with_each_adamw_step(mid):
    """The book recipe (the TRL engine: the Trainer's fused AdamW and TRL's fused LM head, gradient accumulation)
    on the mid-size model: the dry run builds a fused AdamW unless told otherwise, and its traced peak and moment
    are the estimate's. The same step with a foreach and a for-loop AdamW holds, at the optimizer step, what the
    estimate's optimizer moment says for each: foreach exactly one v-sized temporary more than fused."""
    from smolfsdp.audit.dryrun.compare import estimate_for
    from smolfsdp.estimate.recipe_peak import traced_moment

    setup = {"model": mid, "max_length": 256, "gradient_accumulation_steps": 2}
    results = _run_all([(FULL, setup, True, None, a) for a in (None, "foreach", "for-loop")])
    assert [r["setup"]["optimizer"] for r in results] == [
        "torch.optim.AdamW(fused=True)", "torch.optim.AdamW(foreach=True)", "torch.optim.AdamW(foreach=False)",
    ]  # fmt: skip
    fused, foreach, _ = results
    est = estimate_for(load_config(repo_root() / FULL, **setup), 2)  # the recipe's own: fused AdamW
    assert est.adamw == "fused" and traced_moment(fused["peak_moment"]) == est.peak_moment
    assert abs(_row(fused, "peak")["error_pct"]) <= 1.0, _row(fused, "peak")
    for r, adamw in zip(results, ("fused", "foreach", "for-loop"), strict=True):
        moment = estimate_for(load_config(repo_root() / FULL, **setup), 2, adamw=adamw).moments["optimizer"]
        # the step's scalars (AdamW's step counts, the clip's norm) are all the estimate leaves out
        assert 0 <= r["phase_peaks"]["optimizer"] - moment < 4096, (adamw, r["phase_peaks"], moment)
    v = fused["held_bytes"]["optimizer_bytes"] // 2
    assert foreach["phase_peaks"]["optimizer"] - fused["phase_peaks"]["optimizer"] == v


def test_smollm3_3b_traces_again_what_the_grid_committed():
    """Five SmolLM3-3B setups run again here: the same bytes, moment, collectives and FLOPs as committed, the
    estimate within 3 %; on the first, the communication model and the MFU's FLOP formula against the trace."""
    from smolfsdp.estimate.comm import estimate_collectives

    committed = {r["label"]: r for r in _committed_grid()["runs"]}
    rows = [committed[label] for label in CI_SUBSET]
    # rows traced before the dry run took TRL's fused LM head went through transformers' loss: the native step;
    # each with the AdamW step it was traced with (the committed grid: foreach)
    results = _run_all([(row["recipe"], {**row["overrides"], **native_loss(row)}, True, None,
                         traced_adamw(row["setup"])) for row in rows])  # fmt: skip
    for row, r in zip(rows, results, strict=True):
        for key in ("peak_bytes", "peak_moment", "held_bytes", "collectives", "flops_counted"):
            assert r[key] == row[key], (row["label"], key)
        for name in ("parameters", "gradients", "optimizer state"):
            assert _row(r, name)["error_pct"] == 0, (row["label"], name)
        assert abs(_row(r, "peak")["error_pct"]) <= 3.0, (row["label"], _row(r, "peak"))
    r = results[0]  # FSDP2 full fine-tune, no checkpointing, 2 x 2048 on 2 ranks
    # the parameter shards: half of SmolLM3-3B's 3,075,098,624 parameters in fp32 (dim-0 padding included)
    assert r["setup"]["parameters"] == 3_075_098_624
    assert r["held_bytes"]["param_bytes"] == pytest.approx(4 * 3_075_098_624 / 2, rel=1e-4)
    model = estimate_collectives("smollm3-3b", strategy="FULL_SHARD", n_gpus=2, fsdp_version=2)
    traced = {(c["kind"]): (0, 0) for c in r["collectives"]}
    for c in r["collectives"]:
        if c["phase"] in ("forward", "backward"):
            n, b = traced[c["kind"]]
            traced[c["kind"]] = (n + c["count"], b + c["bytes"])
    for kind in ("all-gather", "reduce-scatter"):
        rows = model[model["kind"] == kind]
        assert traced[kind] == (rows["count"].sum(), (rows["count"] * rows["logical_bytes"]).sum()), kind
    # without checkpointing the counted FLOPs are the MFU formula's model FLOPs, 6N + 12·L·H·Q·T per token,
    # plus what the attention backward recomputes (the scores Q·K^T once more: 2·L·H·Q·T per token), which
    # model FLOPs leave out by definition: 1.5 % here
    tokens, seq = r["tokens"], r["setup"]["max_length"]
    recompute = tokens * 2 * 36 * 16 * 128 * seq
    assert r["flops_counted"] == pytest.approx(r["flops_formula"] + recompute, rel=1e-3)
    assert 1.0 < r["flops_counted"] / r["flops_formula"] < 1.02


def test_dryrun_command(mid):
    """``smolfsdp dryrun --json`` on 4 fake ranks: progress on stderr, the labelled report on stdout; the
    table form of the same report names it traced, with the estimate beside it."""
    import subprocess
    import sys

    import pandas as pd

    from smolfsdp.audit.dryrun.dry_run import DryRun
    from smolfsdp.cli_dryrun import format_dryrun

    cmd = [sys.executable, "-m", "smolfsdp.cli", "dryrun", "--config", str(repo_root() / LORA), "--model", mid,
           "--max_length", "256", "--gradient_accumulation_steps", "1", "--gpus", "4", "--json", "--gpu", "L4"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[dryrun] sharding over a fake world of 4" in proc.stderr
    # issue 33: the step itself (most of the time) says each stage, with the seconds since the start
    stages = [
        ln.split(" s  ", 1)[1]
        for ln in proc.stderr.splitlines()
        if ln.startswith("[dryrun] ") and " s  " in ln
    ]
    assert stages == [
        "micro-batch 1/1: forward",
        "micro-batch 1/1: backward",
        "gradient clipping and the AdamW step",
    ]
    assert "almost definitely a bug" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["setup"]["world_size"] == 4 and "not a GPU measurement" in report["label"]
    assert [r["component"] for r in report["estimate_vs_dry_run"]][:3] == [
        "parameters",
        "gradients",
        "optimizer state",
    ]
    table = pd.DataFrame(report.pop("estimate_vs_dry_run"))
    # the caching allocator replayed on the step's allocation order (smolfsdp.audit.allocator_replay)
    replayed = report.pop("allocator_replay")
    fit = report.pop("fit")  # --gpu L4: the replay at the card's capacity (24 GB) less what lives outside it
    assert fit["gpu"] == "L4" and fit["verdict"] == "fits" and fit["retries"] == 0
    assert replayed["peak_reserved"] >= replayed["peak_allocated"] >= replayed["peak_requested"]
    assert replayed["peak_requested"] == report["peak_bytes"]  # no FSDP1 record_stream here (FSDP2)
    text = format_dryrun(DryRun(**report), table)
    assert (
        "over 4 ranks (fake)" in text
        and "traced on fake tensors" in text
        and "estimated" not in text.split("\n")[0]
    )
    # the traced peak names its settings and what smolfsdp memory adds to it (512 + 256 MiB on 4 ranks)
    # (the settings line is smolfsdp.estimate.recipe_peak.settings_line, the one every chapter prints)
    assert "(settings: FSDP2 FULL_SHARD x 4, " in text and "gradient accumulation 1, " in text
    assert (
        "; tensors only; a GPU adds the CUDA context and NCCL buffers, 0.75 GiB in `smolfsdp memory`'s device peak)"
        in text
    )
    assert " during " not in text  # the moment is named once, in the estimator's words ("at the loss moment")
    assert "on a real GPU" not in text  # a report read back from JSON has no allocation order to replay


def test_book_views_of_the_committed_grid():
    """What the chapters show of data/results/dryrun/grid.json: tables that fit the page, sentences counted
    from them, the figure (reads the committed file only: no dry run)."""
    from smolfsdp.book import dryrun_views, tables

    grid = dryrun_views.load_grid()
    assert (
        grid is not None
        and grid["provenance"]["git_sha"]
        and "not measured on a GPU" in grid["provenance"]["what"]
    )
    grid_table, pivot, comm, flops = (f(grid) for f in (dryrun_views.grid_table, dryrun_views.error_pivot,
                                                         dryrun_views.comm_check_table, dryrun_views.flops_table))  # fmt: skip
    for table in (dryrun_views.grid_table(grid, book_only=True), pivot, comm, flops):
        tables.show(table)  # raises when a table is wider than the page allows
    assert (grid_table["static terms"] == "exact").all()
    assert f"in {len(grid_table)} of {len(grid_table)} setups" in dryrun_views.grid_reading(grid)
    assert pivot.size == len(grid["runs"]) == 48 and "not run" not in pivot.to_numpy()  # one cell per setup
    assert (comm["equal"] == "yes").all() and set(comm["ranks"]) == {2, 4, 8}
    assert (dryrun_views.comm_check_table(grid, None)["equal"] == "yes").all()  # every full fine-tune setup
    assert "FSDP1 with LoRA" in dryrun_views.flops_reading(grid)
    from smolfsdp.audit.seeds import claims as sc

    judged = dryrun_views.add_dry_run_evidence([sc.full_model_memory(), sc.per_gpu_memory()], grid)
    assert "16.0 bytes per parameter" in judged[0].evidence[-1]  # the seed's 36 GB is 12 bytes per parameter
    assert "traced on fake tensors" in judged[1].evidence[-1] and judged[1].values["dry_run_peak_bytes"] > 0
    # the per-GPU claim's evidence is the recipe as configured, traced (recipe.json): its own estimate's moment
    assert judged[1].values["dry_run_peak_bytes"] == dryrun_views.load_recipe_trace()["peak_bytes"]
    assert (
        "with 8 micro-batches per step" in judged[1].evidence[-1]
        and "at the loss moment" in judged[1].evidence[-1]
    )
    fig = dryrun_views.plot_step_memory(grid["runs"][0])
    assert {t.name for t in fig.data} >= {"forward", "backward"}
