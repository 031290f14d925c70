"""The seed claims the book judges: each verdict's evidence, computed, against values derived here."""

from pathlib import Path

import pytest
import transformers

from smolfsdp.audit.seeds import claims as sc
from smolfsdp.audit.seeds.fsdp2_claims import PACKAGE
from smolfsdp.audit.seeds.seed_code import run_seed_code
from smolfsdp.book import fsdp_versions
from smolfsdp.estimate.hardware import GPUS, fit_verdict
from smolfsdp.estimate.recipe_peak import recipe_peak
from smolfsdp.probes.dtype_rule import check_dtype_rule

GIB = 2**30


def test_book_recipe_is_the_committed_full_run():
    kw = sc.book_recipe_kwargs()
    assert (kw["seq_len"], kw["micro_batch"], kw["activation_checkpointing"], kw["fsdp_version"]) == (
        2048,
        2,
        True,
        1,
    )
    assert kw["lora"] is None


def test_bytes_per_param_16_not_12_and_the_upcast_is_in_accelerate():
    j = sc.bytes_per_param()
    assert (j.values["seed"], j.values["ours"]) == (12, 16)
    assert j.values["accelerate_fsdp1"].startswith("accelerate/accelerator.py:")
    assert j.values["accelerate_fsdp2"].startswith("accelerate/utils/fsdp_utils.py:")


def test_3b_memory_static_and_peak():
    j = sc.full_model_memory()
    assert j.values["params"] == 3_075_098_624
    assert j.values["seed_bytes"] == 12 * 3_075_098_624  # the seed's ~36 GB
    # 16 B/param on one GPU, plus the FSDP1 padding of nothing (one rank): exactly 16 x params
    assert j.values["static_bytes"] == 16 * 3_075_098_624
    assert round(j.values["static_bytes"] / GIB, 1) == 45.8
    p = sc.per_gpu_memory()
    # the peak at its fullest moment (the TRL engine: TRL's fused LM head makes no [tokens, vocab] logits and the
    # Trainer's fused AdamW no v-sized temporary, so the last micro-batch's loss moment peaks: 25.95 GiB of
    # tensors, the dry run's too) + CUDA context and NCCL constants
    assert (
        round(p.values["static_bytes"] / GIB, 1) == 22.9 and round(p.values["peak_bytes"] / GIB, 2) == 26.70
    )
    assert "at the loss moment" in p.evidence_text and "fused AdamW; tensors + CUDA" in p.evidence_text
    assert p.values["peak_bytes"] > 18 * 10**9


def test_fit_table_rows_flip():
    j = sc.fit_table_rows()
    rows = j.values
    assert rows["A10G, FULL_SHARD over 2"]["fits"] is False
    assert rows["A10G, FULL_SHARD over 2"]["peak_bytes"] > GPUS["A10G"].memory_bytes
    assert rows["L40S, a full copy on 1"]["fits"] is False
    flipped = {k for k, r in rows.items() if r["fits"] != r["seed_fits"]}
    assert flipped == {"A10G, FULL_SHARD over 2", "L40S, a full copy on 1"} and len(rows) == 8
    assert j.verdict == "partly" and j.memory and "2 of 8 cells flip" in j.evidence_text
    # each cell in the one verdict's words and numbers (hardware.fit_verdict), not a peak against the card
    two = recipe_peak(include="device", world_size=2, strategy="FULL_SHARD").estimate
    a10g = fit_verdict(two, GPUS["A10G"])
    assert rows["A10G, FULL_SHARD over 2"]["verdict"] == a10g.word
    assert rows["A10G, FULL_SHARD over 2"]["need_bytes"] == two.device_need_bytes
    assert f"A10G, FULL_SHARD over 2: {a10g.line} (the seed: fits)" in j.evidence_text
    assert all(r["fits"] == (r["verdict"] == "fits") for r in rows.values())


def test_offload_key_ignored_by_installed_transformers():
    j = sc.offload_key()
    assert j.values["seed_key_offloads"] is False and j.values["cpu_offload_key_offloads"] is True
    assert j.values["read_line"].startswith("transformers/training_args.py:")
    _, line = j.values["read_line"].rsplit(":", 1)
    src = Path(transformers.__file__).parent / "training_args.py"
    assert 'fsdp_config.get("cpu_offload"' in src.read_text().splitlines()[int(line) - 1]


def test_fsdp1_deprecated_on_this_stack():
    j = sc.fsdp1_pin()
    assert j.values["fsdp_version"] == 1 and j.values["warned"] is True


def test_offload_policy_base_means_no_offload():
    j = sc.offload_policy()
    assert "no offloading" in j.values["doc"]
    assert j.values["line"].startswith("torch/distributed/fsdp/_fully_shard/_fsdp_param.py:")


def test_lora_size_is_judged_on_the_seeds_llama_3_1_8b():
    from smolfsdp.audit.seeds.memory_claims import llama31_8b_config

    c = llama31_8b_config()
    assert c.max_position_embeddings == 131072 and c.rope_scaling["rope_type"] == "llama3"
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    per_layer = 8 * ((c.hidden_size + c.hidden_size) * 2 + (c.hidden_size + kv) * 2)  # q, o and k, v
    j = sc.lora_size()
    assert j.values["trainable"] == per_layer * c.num_hidden_layers == 6_815_744
    mb = {k: round(v / 1e6, 1) for k, v in j.values.items() if k.endswith("B/param)")}
    assert list(mb.values())[:3] == [13.6, 27.3, 54.5]
    assert j.values["nearest"] == "Adam m + v (8 B/param)" and j.kind == "partly"
    assert "Llama-3.1-8B" in j.says and "is 13.6 MB" in j.correction


def test_sixteen_gb_on_four_against_sequence_length():
    j = sc.sixteen_gb_on_four()
    assert j.values["params"] == 8_030_261_248  # Llama-3.1-8B, published count
    peaks = j.values["peak_bytes"]
    assert [int(s) for s in peaks] == [256, 512, 1024, 2048, 4096]
    on = [p["ac_on"] for p in peaks.values()]
    assert on == sorted(on) and j.values["static_bytes"] < 6 * 10**9 < 8 * 10**9 < peaks["2048"]["ac_on"]
    # at every length the first layer's forward holds the 128k x 4096 root twice (gathered, and FSDP2's all-gather
    # output kept until the next copy-out: smolfsdp.estimate.gather_moment), 4.2 GB on top of the 4 GB shard
    assert j.values["within_8gb"] == [] and 8 * 10**9 < peaks["256"]["ac_on"]
    assert j.verdict == "wrong: optimistic" and j.memory


def test_source_line_names_a_changed_library():
    with pytest.raises(LookupError, match="re-check what cites it"):
        sc.source_line("transformers.training_args", "no such line in any version 123")


def test_dtype_rule_is_per_group_and_trainable_only(tmp_path):
    results = check_dtype_rule(tmp_path)
    ok = {(r["fsdp"], r["case"]): r["ok"] for r in results}
    assert ok == {
        ("FSDP2", "frozen_bf16_beside_trainable_fp32"): True,
        ("FSDP2", "trainable_fp32_and_bf16_same_group"): False,
        ("FSDP2", "trainable_fp32_and_bf16_own_groups"): True,
        # FSDP1: one FlatParameter per unit, one dtype for all of it, frozen or not
        ("FSDP1", "frozen_bf16_beside_trainable_fp32"): False,
        ("FSDP1", "trainable_fp32_and_bf16_same_group"): False,
        ("FSDP1", "trainable_fp32_and_bf16_own_groups"): True,
    }
    refusals = {r["error"].split(" but ")[0] for r in results if not r["ok"]}
    assert refusals == {
        "FSDP expects uniform original parameter dtype",
        "Must flatten tensors with uniform dtype",
    }
    table = fsdp_versions.dtype_rule_table(results)
    assert table.shape == (3, 2) and table.iloc[0].tolist()[1] == "trains"
    j = sc.dtype_rule(results)
    assert "uniform original parameter dtype" in j.evidence_text
    flat = sc.flat_parameter(results)
    assert flat.verdict == "holds" and flat.values == {"fsdp1_ok": False, "fsdp2_ok": True}
    judged = sc.judge_all(results)  # no seed-code run: the claims that need it are left out
    table = sc.summary_table(judged)
    needs_run = sum(need == sc.SEED_CODE for _, need in sc.INVENTORY) - 1  # the wrap-class claim stays
    assert len(table) == len(sc.INVENTORY) - needs_run
    assert {"FSDP2 and parameter dtypes", "FSDP1's FlatParameter"} <= set(table.index)
    assert not table.reset_index().map(lambda v: "`" in str(v)).any().any()  # plain text cells


def test_verdict_summary_counts():
    js = [sc.bytes_per_param(), sc.offload_policy(), sc.lora_size(), sc.bf16_weights()]
    text = sc.verdict_summary(js)
    assert text == (
        "Of 4 claims, 1 holds, 1 holds only in part, 2 are wrong (1 of them because of how the pinned "
        "libraries behave)."
    )
    with_open = sc.verdict_summary([*js, sc.prefetch_overlap(Path("/nonexistent/trace.json.gz"))])
    assert with_open.endswith(
        ", and 1 stays open: prefetch hides communication (needs an FSDP trace from 2+ GPUs)."
    )


@pytest.mark.skipif(not sc.GPU_TRACE.is_file(), reason="needs ../shared/traces")
def test_prefetch_claim_stays_open_with_the_real_trace_as_evidence():
    j = sc.prefetch_overlap()
    assert j.verdict == "open: needs an FSDP trace from 2+ GPUs" and j.seed == sc.SEED1
    assert 84 < j.values["ddp_exposed_pct"] < 86  # the real DDP run hides ~15 % of its NCCL time
    assert f"{j.values['ddp_exposed_pct']:.0f} % of its NCCL time is exposed" in j.evidence_text
    absent = sc.prefetch_overlap(Path("/nonexistent/trace.json.gz"))
    assert "is absent" in absent.evidence_text and absent.values == {}


def test_book_recipe_table_reads_as_text():
    t = sc.book_recipe_table()
    col = t.iloc[:, 0]
    assert col["tokens per GPU per micro-batch"] == "4,096" and col["activation checkpointing"] == "on"
    assert col["FSDP version"] == "FSDP1" and col["LoRA"] == "no (full fine-tune)"
    assert (
        col["gradient accumulation (micro-batches per optimizer step)"] == "8"
    )  # the peak's settings, named


# ------------------------------------------------------------------ the inventory and its evidence
def test_every_claim_has_a_seed_a_section_and_a_verdict_kind():
    judged = sc.judge_all()  # the claims that need no launch
    assert len({j.key for j in judged}) == len(judged)
    for j in judged:
        assert j.seed in (sc.SEED1, sc.SEED2) and j.section and j.kind in sc.VERDICTS, j.key
        assert j.evidence and all(isinstance(e, str) and e for e in j.evidence), j.key
    memory = {j.key for j in judged if j.memory}
    assert memory == {
        "full_model_memory",
        "per_gpu_memory",
        "fit_table",
        "sixteen_gb_on_four",
        "eight_b_full",
    }
    j = next(j for j in judged if j.key == "per_gpu_memory")
    j.evidence.append("a dry run says X")  # where a later measurement goes
    assert j.evidence_text.endswith("a dry run says X")
    with pytest.raises(ValueError, match="must start with one of"):
        sc.Judgement("k", sc.SEED1, "s", "t", "says", "optimistic", ["e"], "c")


def test_batch_size_is_a_lever_at_long_sequences():
    j = sc.batch_size_lever()
    rows = {int(k): v for k, v in j.values.items()}
    shares = [rows[s]["batch_bytes"] / rows[s]["peak_bytes"] for s in (2048, 4096, 8192)]
    # TRL's fused LM head (the seed's SFTTrainer) makes no [tokens, vocab] logits: the batch part stays small
    assert shares == sorted(shares) and shares[2] < 0.25
    assert len({r["static_bytes"] for r in rows.values()}) == 1  # the sharded state does not move
    # with the Trainer's fused AdamW the loss moment peaks at every length (no foreach sqrt(v) at the optimizer
    # step to hide it), so micro-batch 1 saves what the second row's activations and loss tensors take
    saved = rows[8192]["peak_bytes"] - rows[8192]["peak_micro_batch_1"]
    assert (
        round(saved / GIB, 2) == 2.25 and f"micro-batch 1 saves {saved / GIB:,.1f} GiB of a" in j.correction
    )
    assert j.verdict == "holds" and "TRL's fused LM-head loss (no logits) (fused AdamW)" in j.evidence_text
    # with transformers' own loss the logits scale with the batch: a lever of ~15 GiB at 8,192 tokens
    assert "foreach AdamW) the same 8,192-token run saves 14.9 GiB at micro-batch 1" in j.evidence_text


def test_the_seeds_fsdp_config_key_by_key():
    j = sc.fsdp_config_as_written()
    assert j.values["landed"] == {
        "fsdp_version": 1,
        "fsdp_transformer_layer_cls_to_wrap": "SmolLM3DecoderLayer",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_offload_params": False,  # set to True: still no cpu_offload
    }
    assert sum("deprecated" in w for w in j.values["warnings"]) == 2
    table = sc.fsdp_config_table()
    assert table["effect"].tolist() == ["used"] * 4 + ["ignored: no such key"]


def test_a_wrong_wrap_class_through_accelerate_is_an_error():
    j = sc.wrap_class_trainer()
    assert j.values["accelerate"] == {
        f"FSDP{v}": "ValueError: Could not find the transformer layer class LlamaDecoderLayer in the model."
        for v in (1, 2)
    }
    assert j.values["lines"][0].startswith("accelerate/utils/dataclasses.py:") and len(j.evidence) == 1


def test_trainer_and_tracker_claims_from_the_installed_source():
    save = sc.save_strategy_no()  # a run: two Trainer steps with save_strategy="no", then save_model()
    assert save.values["checkpoints_during_training"] == [] and save.values["final_saved"] is True
    assert "model.safetensors" in save.values["final_files"] and save.verdict == "holds"
    t = sc.tracker_env()
    assert t.values["read_in"]["TRACKIO_PROJECT"] == [] and t.values["read_in"]["TRACKIO_SPACE_ID"]
    assert t.values["space_line"].startswith("trackio/utils.py:") and t.verdict == "partly"


def test_8b_full_fine_tune_over_90_gb_and_the_static_share():
    j = sc.eight_b_full()
    assert j.values["static_bytes"] == 16 * 8_030_261_248 and j.verdict == "holds"
    s = sc.static_divides().values
    assert s["1"]["static_bytes"] == 2 * s["2"]["static_bytes"] == 4 * s["4"]["static_bytes"]
    assert s["1"]["peak_bytes"] - s["2"]["peak_bytes"] < s["1"]["peak_bytes"] / 2


# ------------------------------------------------------------------ the seeds' code, run as written
@pytest.fixture(scope="module")
def seed_code(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed-code")
    result = run_seed_code(out)
    assert run_seed_code(out) is result  # cached: the chapter's second read launches nothing
    return result


def test_seed2_set_up_as_written(seed_code):
    rows = seed_code["seed2"]
    llama, own = rows["seed, LlamaDecoderLayer"], rows["seed, SmolLM3DecoderLayer"]
    assert (llama["fsdp_units"], llama["root_group_share"]) == (1, 1.0)  # nothing wrapped per layer
    assert own["fsdp_units"] == 5 and 0.1 < own["root_group_share"] < 0.2
    for r in rows.values():  # every form trains every adapter, and leaves nothing unsharded
        assert r["adapters"] == r["adapters_trainable"] == r["adapters_nonzero_grad"] == 32
        assert r["plain_tensor_params"] == 0
    assert own["adapter_dtypes"] == ["bfloat16"] and rows[PACKAGE]["adapter_dtypes"] == ["float32"]
    err = {k: r["grad_error_vs_fp32"]["relative_l2"] for k, r in rows.items()}
    assert err["all fp32 (reference)"] == 0 and 0 < err["seed, SmolLM3DecoderLayer"] < 0.1
    assert err["seed, SmolLM3DecoderLayer"] == err["seed, SmolLM3DecoderLayer, fp32 reduce"]  # 2 ranks
    table = sc.seed2_table(seed_code)
    assert table.loc["FSDP units"].tolist() == ["1", "5", "5", "5", "5"]


def test_state_dict_collectives_fsdp2_none_fsdp1_one_per_unit(seed_code):
    c = {k: sum(v.values()) for k, v in seed_code["state_dict_collectives"].items()}
    assert c["FSDP2 model.state_dict()"] == c["FSDP2 get_model_state_dict()"] == 0
    assert c["FSDP1 SHARDED_STATE_DICT"] == c["FSDP1 FULL_STATE_DICT"] == 5  # 4 layers + root
    assert sc.state_dict_comm(seed_code).verdict == "holds"


def test_gathers_checkpoint_and_the_trainer_fsdp2_eval(seed_code):
    f = seed_code["full_step"]
    assert f["all_gathers_per_unit"] == {"root": 1, **{f"model.layers.{i}": 2 for i in range(4)}}
    assert f["c10d_all_gathers"] == 9 and f["local_param_fraction"] == pytest.approx(0.5, abs=0.01)
    assert abs(f["checkpoint_bytes_on_disk"] / f["checkpoint_bytes_estimate"] - 1) < 0.05
    t = seed_code["trainer_fsdp2_eval"]
    assert t["outcome"] == "ok" and t["strategy"] == "fsdp2" and t["tied_embeddings"] is True
    assert t["steps"] == t["evaluations"] == 4 and t["train_steps_after_first_eval"] == 3
    # the seed's eval/checkpoint cycle: activation checkpointing on, complete checkpoints after steps 2 and 4
    assert t["activation_checkpointing"] is True and t["checkpoints_saved_at"] == [2, 4]
    assert t["train_steps_after_first_save"] == 2
    judged = {j.key: j for j in sc.judge_all(seed_code=seed_code)}
    assert judged["gotcha1_dtensor"].verdict == "wrong on this stack"
    assert judged["gathers_per_layer"].verdict == "holds"
    assert judged["checkpoint_size"].values["estimate_3b"] > 30 * 10**9
    assert judged["seed2_wrap"].values["units_llama"] == 1 and len(judged["wrap_class_trainer"].evidence) == 2
    assert judged["bf16_reduce"].values["bf16_equals_fp32_reduce"] is True
    b = judged["bf16_reduce"]
    assert b.values["storage"]["package: apply_lora + apply_fsdp2"] == [
        "float32"
    ]  # param_dtype is not storage
    assert b.values["policy_sets_storage"] is False and sorted(b.values["error_ratio"]) == [4, 8]
    assert (
        b.verdict.startswith("partly: bf16 stores only because the seed casts the model")
        and "4 ranks" in b.verdict
    )
    assert "bf16 for the gathered" not in b.says and "parameter storage" in b.says
    g = judged["gotcha1_dtensor"]
    assert "untested here: bf16 compute on GPUs, the 3B model" in g.correction
    saw = judged["sawtooth_units"]
    assert (saw.values["layer_units"], saw.values["layers"], saw.values["units_wrong_class"]) == (4, 4, 1)
    assert saw.kind == "partly"
    m = judged["meta_init"]
    assert m.values["fsdp2"]["finite"] and m.values["fsdp2"]["params_on_meta_after_shard"] == 38
    assert m.values["fsdp1"]["outcome"].startswith("AttributeError") and m.verdict == "holds"


def test_reentrant_checkpointing_trains_through_the_input_grad_hooks(seed_code):
    ck = seed_code["seed2_checkpointing"]
    # transformers' gradient_checkpointing_enable and peft's get_peft_model: one hook each
    assert {k: v["input_grad_hooks"] for k, v in ck.items()} == dict.fromkeys(ck, 2)
    for form in ("default checkpointing", "use_reentrant=False", "use_reentrant=True"):
        assert ck[form]["adapters_nonzero_grad"] == ck[form]["adapters"] == 32, form
    control = ck["use_reentrant=True, hooks removed"]
    assert control["input_grad_hooks_left"] == 0 and control["adapters_nonzero_grad"] == 0
    assert "does not require grad" in control["error"]
    j = sc.seed2_adapters(seed_code)
    assert j.values["reason_is_hook"] is True and "not because of `use_reentrant=False`" in j.correction


def test_fsdp_communication_against_ddp():
    j = sc.comm_volume()
    assert 1.4 < j.values["fp32_ratio"] < 1.5  # the extra backward all-gather (the root is kept: not 1.5)
    assert j.values["fsdp_sent"] < j.values["ddp_sent"]  # bf16 gathers against an fp32 all-reduce
    # judged at equal precision (every collective fp32): FSDP sends more
    assert j.values["fp32_sent"]["FULL_SHARD"] > j.values["fp32_sent"]["NO_SHARD"] and j.verdict == "holds"


def test_no_verdict_is_a_constant():
    """Every Judgement's verdict is an expression of names (the evidence), never a literal string."""
    import ast

    import smolfsdp.audit.seeds as pkg

    found = 0
    for path in Path(pkg.__file__).parent.glob("*_claims.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Judgement":
                if len(node.args) < 6:  # the class's own docstring example aside
                    continue
                verdict = node.args[5]
                names = [n for n in ast.walk(verdict) if isinstance(n, ast.Name)]
                assert not isinstance(verdict, ast.Constant) and names, f"{path.name}:{node.lineno}"
                found += 1
    assert found == len(sc.INVENTORY) == 35


def test_verdicts_follow_their_evidence(tmp_path, monkeypatch):
    from smolfsdp.audit.seeds import memory_claims, trainer_claims

    # no grid: FSDP1 vs FSDP2 is open; a grid where FSDP2 is higher: wrong
    assert sc.deterministic_memory(tmp_path / "absent.json").verdict.startswith("open")
    row = {"overrides": {"lora": False, "activation_checkpointing": True, "max_length": 2048, "nproc": 2}}
    runs = [{**row, "overrides": {**row["overrides"], "fsdp_version": v}, "peak_bytes": b}
            for v, b in ((1, 10 * GIB), (2, 12 * GIB))]  # fmt: skip
    (tmp_path / "grid.json").write_text(__import__("json").dumps({"runs": runs}))
    assert sc.deterministic_memory(tmp_path / "grid.json").kind == "wrong"
    # a save that wrote periodic checkpoints: no longer holds
    monkeypatch.setattr(trainer_claims, "run_save_strategy_no", lambda out: {
        "steps": 2, "files_after_training": ["checkpoint-1"], "final_files": ["model.safetensors"]})  # fmt: skip
    assert sc.save_strategy_no().kind == "partly"
    # a model that fits in 8 GB at every length: holds (Llama 3.2 1B in the 8B's place: 8B's 128k x 4096 root,
    # gathered twice in the first layer's forward, keeps it above 8 GB at any length)
    from smolfsdp.estimate.params import resolve_model_config
    from smolfsdp.paths import repo_root

    monkeypatch.setattr(memory_claims, "SIXTEEN_SEQS", (64,))
    small = resolve_model_config(str(repo_root() / "data/models/llama3_2_1b"))
    monkeypatch.setattr(memory_claims, "llama31_8b_config", lambda: small)
    assert memory_claims.sixteen_gb_on_four().verdict == "holds"


def test_the_committed_grid_compares_fsdp1_and_fsdp2():
    j = sc.deterministic_memory()
    pairs = j.values["pairs"]
    assert len(pairs) == 24 and j.values["higher"] == 0
    lower = [p for p in pairs if p["fsdp2"] < p["fsdp1"] - GIB // 10]
    assert {(p["lora"], p["ac"]) for p in lower} == {(True, False)} and len(lower) == 6
    at = {(p["seq"], p["ranks"]): p for p in lower}
    assert round((at[(2048, 2)]["fsdp1"] - at[(2048, 2)]["fsdp2"]) / GIB, 1) == 5.3
    assert j.verdict == "partly: lower only for LoRA without checkpointing; predictability open"


def test_bf16_reduction_costs_from_four_ranks():
    from smolfsdp.probes.reduce_precision import reduce_cost

    r = reduce_cost()
    assert r[2]["bf16_equals_fp32_bf16"] is True  # equal by construction on 2 ranks
    for w in (4, 8):
        e = r[w]["relative_l2"]
        assert r[w]["bf16_equals_fp32_bf16"] is False
        assert (
            e["bf16 reduce"] > 1.2 * e["fp32 reduce, bf16 gradient"]
            and e["fp32 reduce, fp32 gradient"] < 1e-8
        )
    assert r[8]["relative_l2"]["bf16 reduce"] > r[4]["relative_l2"]["bf16 reduce"]
    with pytest.raises(ValueError, match="must divide by every world size"):
        reduce_cost(numel=1001, world_sizes=(8,))


def test_step_bursts_and_the_plugin_tables_mixed_precision():
    j = sc.step_bursts()
    assert j.values["collectives_by_phase"]["clip"] == ["all-reduce"]
    assert "reduce-scatter" in j.values["collectives_by_phase"]["backward"] and j.kind == "partly"
    t = sc.plugin_args_side_by_side()
    assert t.loc["mixed_precision_policy", "the package (smollm3_3b_medical)"] == (
        "param bfloat16, reduce float32, buffer float32"
    )
