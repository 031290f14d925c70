"""Each gotcha's failing form fails the way the chapter says, and its fixed form works (2 gloo ranks).

All gotchas run once (one torchrun launch for the distributed ones, subprocesses for the rest) and
the tests read the shared results.
"""

import os
import re

import pytest

from smolfsdp.book import gotchas_view, tables
from smolfsdp.errors import ConfigError
from smolfsdp.gotchas import cases_distributed
from smolfsdp.gotchas import run_all as gotchas
from smolfsdp.gotchas.registry import WRONG


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return gotchas.run_gotchas(out=tmp_path_factory.mktemp("gotchas"))


def test_every_gotcha_ran_with_versions(results):
    assert list(results) == list(gotchas.GOTCHAS)
    for r in results.values():
        assert r.versions["torch"].startswith("2.13.0") and r.explanation
        assert {r.failing["outcome"], r.fixed["outcome"]} <= {
            "ok",
            "error",
            "crash",
            "measured",
            "skipped",
            WRONG,
        }
    frame = gotchas.summary_frame(results)
    assert list(frame["gotcha"]) == list(gotchas.GOTCHAS)
    assert frame.set_index("gotcha").loc["tied_embeddings"].to_dict() == {
        "failing": "ValueError",
        "fixed": "ok",
    }


def test_fsdp2_mixed_dtensor_outside_the_root(results):
    r = results["fsdp2_mixed_dtensor"]
    assert r.failing["outcome"] == "error" and r.failing["error"] == "RuntimeError"
    assert "got mixed torch.Tensor and DTensor" in r.failing["message"]
    assert r.fixed["outcome"] == "ok" and r.fixed["shape"] == [2, 24, 128]
    assert r.fixed["parameter_types_after"] == ["DTensor"]  # resharded after the explicit unshard
    assert r.seed_fix["error"] == "RuntimeError"  # pinning FSDP1 (the seed's fix) does not fix this form
    assert "'weight' must be 2-D" in r.seed_fix["message"] and "1-D shard" in r.seed_fix["why"]
    assert r.fixed["fsdp1_summon"]["shape"] == [2, 24, 128]
    # before: the seed's failing fix was a row "fsdp1 pinned" in the fixed column, as if our fix failed
    table = gotchas_view.side_by_side(r)
    assert list(table.columns) == ["failing", "the seed's fix", "fixed"]
    assert table.loc["outcome"].tolist() == [
        f"error: RuntimeError: {r.failing['message']}",
        f"still fails: RuntimeError: {r.seed_fix['message']}. Why: {r.seed_fix['why']}",
        "ok",
    ]
    assert "fsdp1 pinned" not in table.index and not table["fixed"].str.contains("error").any()
    assert table.loc["FSDP1 summon"].tolist() == ["—", "—", "ok; shape: 2, 24, 128"]


def test_checkpoint_refused_before_it_fills_the_disk(results):
    r = results["checkpoint_disk_full"]
    if r.failing["outcome"] == "skipped":
        pytest.skip(r.failing["message"])
    assert r.failing["outcome"] == "error" and r.failing["left_behind"] == ["state.pt"]
    assert 0 < r.failing["left_bytes"] <= r.failing["filesystem_bytes"] < r.failing["needed_bytes"]
    assert r.fixed["error"] == "DiskSpaceError" and r.fixed["refused_before_training"]
    assert f"{r.failing['needed_bytes']:,} bytes" in r.fixed["message"]


def test_trackio_metrics_land_in_the_expected_project_once(results):
    r = results["tracker_wrong_project"]
    assert r.failing["train_loss_rows"] == {"huggingface/trainer": 2, "smolfsdp-medical/by-hand": 0}
    assert not r.failing["loss_in_expected_project"]
    assert r.failing["outcome"] == WRONG and "huggingface/trainer" in r.failing["symptom"]
    assert r.failing["final_finish"]["error"] == "RuntimeError"  # the hand-made session was replaced
    assert r.fixed["train_loss_rows"] == {"smolfsdp-medical/trainer": 2}
    assert r.fixed["loss_in_expected_project"] and r.fixed["runs_with_loss"] == 1


def test_wrap_class_missing_and_wrapping_nothing(results):
    r = results["wrap_class"]
    assert r.failing["misspelt"]["error"] == "ConfigError"
    assert "Did you mean 'SmolLM3DecoderLayer'" in r.failing["misspelt"]["message"]
    assert r.failing["fsdp_units"] == 1 and r.failing["decoder_layers"] == 4
    assert r.failing["outcome"] == WRONG and "no decoder layer wrapped" in r.failing["symptom"]
    assert r.failing["check_wrapping"]["error"] == "ConfigError"
    assert r.fixed == {"outcome": "ok", "fsdp_units": 5}


def test_check_wrapping_accepts_a_model_without_layers():
    import torch

    with pytest.raises(ConfigError, match="wrapped none of the 1"):
        cases_distributed.check_wrapping(torch.nn.Sequential(torch.nn.Linear(2, 2)), "Linear")
    assert cases_distributed.check_wrapping(torch.nn.Linear(2, 2), "Conv1d") == 0


def test_trainer_fsdp_runs_as_ddp_on_cpu(results):
    r = results["trainer_fsdp_is_ddp"]
    assert r.failing["requested"] == "fsdp1" and r.failing["strategy"] == "ddp"
    assert r.failing["wrapper"] == "DistributedDataParallel" and r.failing["held_per_rank"] == 1.0
    assert r.failing["outcome"] == WRONG and r.failing["symptom"] == "asked for fsdp1, ran ddp"
    assert r.fixed["outcome"] == "measured"
    assert r.fixed["strategy"] == "fsdp1" and r.fixed["fsdp_units"] == 5
    assert r.fixed["wrapper"] == "FullyShardedDataParallel" and r.fixed["held_per_rank"] == 0.5
    assert "smolfsdp.train.accelerate_cpu_fsdp" in r.fixed["reason"]
    held = gotchas_view.side_by_side(r).loc["held per rank"].tolist()
    assert held == ["100%", "50%"]  # before: "1.0000" / "0.5000"


def test_gradient_checkpointing_recomputes_without_extra_all_gather(results):
    r = results["gradient_checkpointing"]
    # 4 layers gathered twice + the root once: since apply_fsdp2 keeps the root gathered after forward
    # (root_reshard_after_forward=False, the mechanisms merge) FSDP2 counts as FSDP1 does
    for version, gathers in (("fsdp1", 9), ("fsdp2", 9)):
        assert r.fixed[f"{version}/none"] == {"all-gather": gathers, "reduce-scatter": 5, "layer_forwards": 4}
        for mode in ("fsdp_ac",):
            assert r.fixed[f"{version}/{mode}"]["layer_forwards"] == 8  # the layers really are recomputed
            assert r.fixed[f"{version}/{mode}"]["all-gather"] == gathers
        for mode in ("hf_use_reentrant_false", "hf_use_reentrant_true"):
            assert r.failing[f"{version}/{mode}"] == {
                "all-gather": gathers,
                "reduce-scatter": 5,
                "layer_forwards": 8,
            }


def test_tied_embeddings_in_separate_groups(results):
    r = results["tied_embeddings"]
    assert (
        r.failing["error"] == "ValueError"
        and "shared with a parameter already managed" in r.failing["message"]
    )
    assert r.fixed == {"outcome": "ok", "same_parameter": True, "max_abs_diff": 0.0}
    shown = gotchas_view.side_by_side(r)
    assert shown.loc["max abs diff", "fixed"] == "0 (bitwise identical)"  # never a rounded "0.0000"


def test_weight_differences_read_exactly():
    assert tables.difference_text(0.0) == "0 (bitwise identical)"
    assert tables.difference_text(0.00417) == "4.17 × 10⁻³"
    assert gotchas_view._value(0.0, "max_param_change") == "0 (no weight changed)"
    assert gotchas_view._value(2.5e-7, "max_param_change") == "2.50 × 10⁻⁷"
    assert gotchas_view._value([2, 24, 128], "shape") == "2 x 24 x 128"


def test_optimizer_before_sharding_never_updates(results):
    r = results["optimizer_before_sharding"]
    # the failing form raises nothing: its outcome must name the symptom, never read "ok"
    assert r.failing["outcome"] == WRONG and "no weight changed" in r.failing["symptom"]
    assert r.fixed["outcome"] == "ok"
    assert r.failing["max_param_change"] == 0.0 and r.failing["optimizer_params_with_grad"] == 0
    assert r.fixed["max_param_change"] > 1e-3 and r.fixed["optimizer_params_with_grad"] > 0
    assert r.failing["loss"] == r.fixed["loss"]  # same model, same batch: only the optimizer differs


def test_peft_fp32_adapters_break_fsdp1_flattening(results):
    r = results["peft_fp32_adapters_fsdp1"]
    assert r.failing["error"] == "ValueError" and "uniform dtype" in r.failing["message"]
    assert r.fixed == {"outcome": "ok", "dtypes": ["bfloat16"], "fsdp_units": 5}


def test_fsdp1_cpu_offload_state_dict_segfaults_rank0(results):
    r = results["fsdp1_cpu_offload_state_dict"]
    assert r.failing["outcome"] == "crash" and r.failing["rank_exit_codes"]["rank0"] == -11
    assert r.fixed["outcome"] == "ok" and r.fixed["keys_on_rank"] == 39


def test_cli_lists_and_refuses_unknown(capsys):
    assert gotchas.main(["--list"]) == 0
    assert "optimizer_before_sharding" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="unknown gotcha"):
        gotchas.run_gotchas(["no_such_gotcha"])
    assert "RANK" not in os.environ  # nothing here joined a process group


# ------------------------------------------------------------------ the chapter's tables of them
# a dict/list repr or a NaN in a rendered cell (an error message may hold "[enforce fail ...]")
REPR = re.compile(r"\{'|\['|\[\d|\bnan\b|\bNone\b")


def test_every_gotcha_renders_failing_and_fixed_side_by_side(results):
    for name, r in results.items():
        frame = gotchas_view.grid(r) if gotchas_view.is_grid(r) else gotchas_view.side_by_side(r)
        cells = " ".join(str(v) for v in frame.to_numpy().ravel())
        assert not REPR.search(cells), (name, cells)
        html = gotchas_view.section(r)._repr_html_()
        assert "white-space: normal" in html and r.explanation.split()[0] in html
    opt = gotchas_view.side_by_side(results["optimizer_before_sharding"])
    assert list(opt.columns) == ["failing", "fixed"]
    assert opt.loc["outcome"].tolist() == ["wrong result: optimizer.step() ran and no weight changed", "ok"]
    assert opt.loc["optimizer params with grad"].tolist() == ["0", "38"]
    assert opt.loc["loss", "failing"] == f"{results['optimizer_before_sharding'].failing['loss']:.4f}"
    crash = gotchas_view.side_by_side(results["fsdp1_cpu_offload_state_dict"])
    assert crash.loc["outcome", "failing"] == "crash: rank0 killed by SIGSEGV"
    disk = results["checkpoint_disk_full"]
    if disk.fixed["outcome"] != "skipped":
        said = gotchas_view.side_by_side(disk).loc["outcome", "fixed"]
        assert said.startswith("refused: DiskSpaceError: ") and disk.fixed["message"] in said  # never cut
    # before: rows labelled "failing"/"fixed" (the `none` baseline read "fixed"); now by their setting
    grid = gotchas_view.grid(results["gradient_checkpointing"])
    assert list(grid.columns) == [
        "FSDP version",
        "activation recomputation",
        "all-gather",
        "reduce-scatter",
        "layer forwards",
    ]
    settings = list(gotchas_view.SETTING_WORDS.values())
    assert grid["FSDP version"].tolist() == ["FSDP1"] * 4 + ["FSDP2"] * 4
    assert grid["activation recomputation"].tolist() == settings * 2
    assert settings[0] == "none (activations stored)" and settings[1] == "FSDP activation checkpointing"
    assert grid["layer forwards"].tolist() == [4, 8, 8, 8] * 2  # from the profiled runs


def test_overview_says_what_each_form_did(results):
    frame = gotchas_view.overview(results).set_index("gotcha")
    assert len(frame) == len(gotchas.GOTCHAS)
    row = frame.loc[results["optimizer_before_sharding"].title]
    assert row.tolist() == ["wrong result: optimizer.step() ran and no weight changed", "ok"]
    assert frame.loc[results["tied_embeddings"].title].tolist() == ["error (ValueError)", "ok"]
    assert "ok" not in frame["failing form"].tolist()  # no failing form may read as if it worked
    assert not REPR.search(tables.show(frame).to_html().split("</style>")[-1])


def test_run_gotchas_says_it_still_runs_while_a_local_gotcha_works(monkeypatch, tmp_path):
    """Issue 33: chapter 06's cell sat 18 s silent while tracker_wrong_project ran its two Trainer runs in this
    process: a local gotcha gets a heartbeat line every HEARTBEAT_S, and a crashing one says each launch."""
    import time

    def slow(out):
        time.sleep(0.45)
        return {"failing": {"outcome": "ok"}, "fixed": {"outcome": "ok"}}

    monkeypatch.setattr(gotchas, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(gotchas.GOTCHAS["tracker_wrong_project"], "fn", slow)
    monkeypatch.setattr(gotchas, "_crash_form", lambda out, offload: {"outcome": "ok"})
    said: list[str] = []
    gotchas.run_gotchas(["tracker_wrong_project", "fsdp1_cpu_offload_state_dict"], tmp_path, said.append)
    beats = [s for s in said if s.startswith("tracker_wrong_project: still running, ")]
    assert said[0].startswith("running tracker_wrong_project (") and 2 <= len(beats) <= 5, said
    assert said[-2].startswith("running fsdp1_cpu_offload_state_dict (")
    assert said[-1] == "running fsdp1_cpu_offload_state_dict: its fixed form (a second launch)"
