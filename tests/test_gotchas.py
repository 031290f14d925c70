"""Each gotcha's failing form fails the way the chapter says, and its fixed form works (2 gloo ranks).

All gotchas run once (one torchrun launch for the distributed ones, subprocesses for the rest) and
the tests read the shared results.
"""

import os
import re
from html import escape

import pytest

from smolfsdp.book import gotchas_view, tables
from smolfsdp.errors import ConfigError
from smolfsdp.gotchas import cases_distributed, explained
from smolfsdp.gotchas import run_all as gotchas
from smolfsdp.gotchas.explained import EXPLAINED
from smolfsdp.gotchas.registry import REPORTED, WRONG
from smolfsdp.lora_options import QUANTISED_REFUSAL


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
    assert table.loc["FSDP1 summon"].tolist() == ["—", "—", "ok; shape: 2 x 24 x 128"]  # before: "2, 24, 128"


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
        assert "white-space: normal" in html and escape(r.explanation.split()[0]) in html  # "SmolLM3&#x27;s"
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


# ------------------------------------------------------------------ problems users reported (issue 43)
def test_reported_gotchas_carry_their_thread(results):
    for name in REPORTED:
        assert results[name].thread.startswith("https://github.com/"), name
        html = gotchas_view.section(results[name])._repr_html_()
        assert f'Reported upstream: <a href="{results[name].thread}">' in html
    assert results["forward_before_optimizer"].thread.endswith("pytorch/pytorch/issues/149205")


def test_forward_before_optimizer_leaves_the_root_group_untrained(results):
    r = results["forward_before_optimizer"]
    root = ["model.embed_tokens.weight", "model.norm.weight"]  # lm_head is embed_tokens (tied)
    assert r.failing["outcome"] == WRONG and r.failing["parameters_unchanged"] == root
    assert r.failing["optimizer_got_plain_tensors"] == root
    assert r.failing["losses"][-1] < r.failing["losses"][0]  # the loss falls: nothing looks wrong
    assert r.fixed["outcome"] == "ok" and r.fixed["parameters_unchanged"] == "none"
    assert r.fixed["optimizer_got_plain_tensors"] == "none"
    assert r.fixed["losses"][0] == r.failing["losses"][0] and r.fixed["losses"][-1] < r.failing["losses"][-1]
    assert r.fixed["reshard_before_optimizer"]["losses"] == r.fixed["losses"]  # model.reshard() is a fix too
    assert r.failing["losses"] == pytest.approx([6.9995, 6.6307, 6.7285], abs=2e-4)
    assert r.fixed["losses"] == pytest.approx([6.9995, 6.3771, 5.1197], abs=2e-4)
    assert [w.split(":")[0] for w in r.failing["where"]] == [
        "torch/distributed/fsdp/_fully_shard/_fsdp_state.py",
        "torch/distributed/fsdp/_fully_shard/_fsdp_param.py",
    ]
    assert all(w.split(":")[1].isdigit() for w in r.failing["where"])


def test_qlora_integer_storage_and_the_bf16_fix(results):
    r = results["qlora_integer_storage"]
    assert r.failing["storage_dtype"] == "uint8" and r.failing["error"] == "ValueError"
    assert r.failing["message"] == "Cannot flatten integer dtype tensors"
    assert r.fixed["storage_dtype"] == "bfloat16" and r.fixed["fsdp_units"] == 5
    assert r.fixed["packed_bytes_identical"] is True and r.fixed["max_abs_diff"] == 0.0
    assert r.fixed["fsdp2_uint8_storage"] == {"outcome": "ok", "max_abs_diff": 0.0}


def test_packed_4bit_stand_in_round_trips_its_bytes():
    import torch

    from smolfsdp.gotchas.cases_reported import Packed4bitLinear

    linear = torch.nn.Linear(8, 3, bias=False)
    q8, bf = Packed4bitLinear(linear, torch.uint8), Packed4bitLinear(linear, torch.bfloat16)
    assert q8.weight.dtype == torch.uint8 and tuple(q8.weight.shape) == (3, 4)  # two 4-bit values a byte
    assert bf.weight.dtype == torch.bfloat16 and torch.equal(bf.weight.view(torch.uint8), q8.weight)
    x = torch.randn(2, 8)
    assert torch.equal(q8(x), bf(x))  # the storage dtype changes nothing but the container
    err = (q8(x) - linear(x)).abs().max() / linear(x).abs().max()
    assert 0 < err < 0.2  # 4-bit quantisation: close, not equal


def test_kv_cache_with_checkpointing_breaks_backward_and_the_fix(results):
    r = results["kv_cache_checkpointing"]
    assert r.failing["error"] == "RuntimeError"
    assert "The size of tensor a (48) must match the size of tensor b (24)" in r.failing["message"]
    assert r.fixed["use_cache"] is False and r.fixed["without_checkpointing"]["use_cache"] is True
    assert r.fixed["loss"] == r.fixed["without_checkpointing"]["loss"] == pytest.approx(7.004031, abs=1e-5)


def test_state_dict_gathered_by_one_rank_times_out_and_the_guard_names_it(results):
    r = results["state_dict_one_rank"]
    assert r.failing["called_on"] == "rank 0 only" and r.failing["error"] == "RuntimeError"
    assert r.failing["message"] == "Timed out waiting 1500ms for send operation to complete"
    assert r.failing["group_timeout_s"] <= r.failing["waited_s"] < r.failing["group_timeout_s"] + 5
    guard = r.failing["package_guard"]
    assert guard["error"] == "CollectiveError" and "rank 0 of 2: collective all_gather" in guard["message"]
    assert "Another rank never joined it" in guard["message"]
    assert r.fixed == {"outcome": "ok", "called_on": "every rank", "keys_on_rank0": 39}
    assert r.failing["where"].startswith("torch/distributed/_state_dict_utils.py:")
    said = gotchas_view.side_by_side(r)
    assert "input sizes 512 × 128" in said.loc["package guard", "failing"]  # before: "[[512, 128]]"
    assert said.loc["group timeout (s)", "failing"] == "1.5"
    # what the same hang lasts with the installed defaults (seconds): torch's process group, the Trainer's
    assert r.failing["default_timeouts_s"] == {"torch default_pg_timeout": 1800, "Trainer ddp_timeout": 1800}
    assert (
        said.loc["default timeouts (s)", "failing"]
        == "torch default pg timeout: 1,800; Trainer ddp timeout: 1,800"
    )


def test_rank0_working_alone_times_out_the_waiting_rank(results):
    r = results["rank0_works_alone"]
    assert r.failing["message"] == "Timed out waiting 1500ms for recv operation to complete"
    assert r.failing["by_rank"]["rank1"] == (
        "RuntimeError (Timed out waiting 1500ms for recv operation to complete) after 1.5 s"
    )
    assert r.failing["by_rank"]["rank0"].startswith("RuntimeError (Connection closed by peer) after 3.")
    assert r.fixed["outcome"] == "ok" and r.fixed["group_timeout_s"] > r.fixed["rank0_works_s"]
    assert r.fixed["by_rank"] == {"rank0": "ok after 3.0 s", "rank1": "ok after 3.0 s"}
    assert [w.split(":")[0] for w in r.failing["where"]] == [
        "trl/trainer/sft_trainer.py",
        "accelerate/state.py",
        "transformers/training_args.py",
    ]


def test_clip_grad_norm_on_fsdp1_clips_each_shard_by_its_own_norm(results):
    r = results["clip_grad_norm_fsdp1"]
    local, model = r.failing["norm_returned"], r.fixed["norm_returned"]
    assert local == pytest.approx({"rank0": 3.3714, "rank1": 0.7026}, abs=5e-4)
    assert model == pytest.approx({"rank0": 3.4438, "rank1": 3.4438}, abs=5e-4)
    assert (local["rank0"] ** 2 + local["rank1"] ** 2) ** 0.5 == pytest.approx(model["rank0"], abs=1e-3)
    assert r.failing["outcome"] == WRONG and r.fixed["outcome"] == "ok"
    # rank 0's shard is clipped to 1, rank 1's (0.70 < 1) is not: the whole gradient ends above max_norm
    assert r.failing["global_norm_after_clipping"] == pytest.approx(
        (1 + local["rank1"] ** 2) ** 0.5, abs=1e-3
    )
    assert r.fixed["global_norm_after_clipping"] == pytest.approx(r.fixed["max_norm"], abs=1e-4)


def test_bf16_weights_lose_most_small_updates(results):
    r = results["bf16_weights_lose_updates"]
    assert r.failing["sharded_weights_dtype"] == "bfloat16" and r.fixed["sharded_weights_dtype"] == "float32"
    assert r.failing["learning_rate"] == r.fixed["learning_rate"] == 1e-5
    assert r.failing["weights"] == r.fixed["weights"] == 869_504
    assert r.failing["weights_changed"] == pytest.approx(0.1556, abs=5e-4) and r.failing["outcome"] == WRONG
    assert r.fixed["weights_changed"] == 1.0
    shown = gotchas_view.side_by_side(r).loc["weights changed"].tolist()
    assert shown == [f"{r.failing['weights_changed']:.1%}", "100%"]  # before: "0.1556" / "1.0000"


def test_load_in_4bit_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    from smolfsdp.cli_args import parse_overrides
    from smolfsdp.config import check_keys

    for flag in ("--load_in_4bit", "--load-in-8bit=true", "--bnb_4bit_quant_storage"):
        with pytest.raises(ConfigError, match="does not load models in 4 or 8 bits .QLoRA.") as err:
            parse_overrides([flag])
        assert "qlora_integer_storage" in str(err.value) and "unknown option" not in str(err.value)
    with pytest.raises(ConfigError, match="'load_in_4bit' in recipe.yaml: smolfsdp does not load"):
        check_keys(["load_in_4bit"], "recipe.yaml")
    cmd = [sys.executable, "-m", "smolfsdp.cli", "train", "--load_in_4bit"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"smolfsdp: error: --load_in_4bit: {QUANTISED_REFUSAL}"]


def test_explained_problems_cite_installed_lines_and_threads():
    frame = gotchas_view.explained_table()
    assert list(frame.columns) == [
        "problem",
        "why it is not run here",
        "where (installed source)",
        "reported in",
    ]
    assert len(frame) == len(EXPLAINED) and len({e.name for e in EXPLAINED}) == len(EXPLAINED)
    for item in EXPLAINED:
        lines = explained.source_lines(item)  # LookupError if an installed library moved a cited line
        assert len(lines) == len(item.sources) and all(re.fullmatch(r"[\w/.]+\.py:\d+", ln) for ln in lines)
        assert item.threads and all(t.startswith("https://github.com/") for t in item.threads)
        said = gotchas_view.explained_markdown(item.name)
        assert said.startswith(f"**{item.title}.**") and all(f"`{ln}`" in said for ln in lines)
    with pytest.raises(LookupError, match="re-check"):
        explained.installed_line("torch/nn/modules/linear.py", "no such text in torch")
    with pytest.raises(KeyError, match="no explained problem"):
        gotchas_view.explained_markdown("nope")


def test_eval_logits_bytes_of_the_book_recipe():
    from smolfsdp.config import load_config
    from smolfsdp.estimate.params import resolve_model_config
    from smolfsdp.paths import recipe

    assert explained.gathered_logits_bytes(2, 3, 5, 2) == 60
    cfg = load_config(recipe("smollm3_3b_medical"))
    vocab = resolve_model_config(cfg.model).vocab_size
    frame = gotchas_view.eval_logits_frame(cfg, resolve_model_config(cfg.model)).set_index(
        "held on every rank"
    )
    step, whole, ids = frame["GiB"].tolist()
    assert whole * 2**30 == cfg.eval_size * cfg.max_length * vocab * 2  # bf16 logits of every eval row
    assert step / whole == cfg.per_device_eval_batch_size * cfg.nproc / cfg.eval_size
    assert ids / whole == 8 / (2 * vocab)  # int64 argmax ids instead of a vocabulary-wide bf16 row
    assert whole > 80  # more than an 80 GB GPU holds (SmolLM3-3B: 128,256-token vocabulary)
