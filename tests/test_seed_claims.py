"""The seed claims the book judges: each verdict's evidence, computed, against values derived here."""

from pathlib import Path

import pytest
import transformers

from smolfsdp.book import fsdp_versions
from smolfsdp.book import seed_claims as sc
from smolfsdp.book.dtype_rule import check_dtype_rule
from smolfsdp.measure.hardware import GPUS
from smolfsdp.measure.params import resolve_model_config

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
    assert round(p.values["static_bytes"] / GIB, 1) == 22.9 and round(p.values["peak_bytes"] / GIB, 1) == 30.9
    assert p.values["peak_bytes"] > 18 * 10**9


def test_fit_table_rows_flip():
    j = sc.fit_table_rows()
    rows = j.values
    assert rows["A10G, FULL_SHARD over 2"]["fits"] is False
    assert rows["A10G, FULL_SHARD over 2"]["peak_bytes"] > GPUS["A10G"].memory_bytes
    assert rows["L40S, a full copy on 1"]["fits"] is False
    assert j.verdict == "wrong"


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


def test_lora_size_counts_from_the_config():
    c = resolve_model_config("smollm3-3b")
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    per_layer = 8 * (
        (c.hidden_size + c.hidden_size) * 2 + (c.hidden_size + kv) * 2
    )  # q, o and k, v: r x (in + out)
    j = sc.lora_size()
    assert j.values["trainable"] == per_layer * c.num_hidden_layers == 3_833_856
    assert j.values["Adam m + v (8 B/param)"] == 8 * 3_833_856
    assert j.values["nearest"] == "fp32 adapter + Adam m + v (12 B/param)"
    assert (
        "is 15.3 MB with the fp32 adapters the book's LoRA runs keep, 7.7 MB if saved in bf16" in j.correction
    )


def test_sixteen_gb_on_four_is_optimistic():
    j = sc.sixteen_gb_on_four()
    assert j.values["params"] == 8_030_261_248  # Llama-3-8B, published count
    ac = j.values["activation checkpointing"]
    assert ac["static_bytes"] < 6 * 10**9 < 8 * 10**9 < ac["peak_bytes"]
    assert j.verdict == "optimistic"


def test_source_line_names_a_changed_library():
    with pytest.raises(LookupError, match="re-check the claim"):
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
    assert "uniform original parameter dtype" in j.evidence
    table = sc.summary_table(sc.judge_all(results))
    assert len(table) == 11 and table.index[8] == "FSDP2 and parameter dtypes"
    assert not table.reset_index().map(lambda v: "`" in str(v)).any().any()  # plain text cells


def test_verdict_summary_counts():
    js = [sc.bytes_per_param(), sc.offload_policy(), sc.lora_size()]
    text = sc.verdict_summary(js)
    assert text.startswith("Of 3 claims, 2 are wrong (1 of them because of how the pinned libraries behave)")
    assert "size of the LoRA update: right in size, wrong in what it names" in text and text.endswith(").")
    with_open = sc.verdict_summary([*js, sc.prefetch_overlap(Path("/nonexistent/trace.json.gz"))])
    assert "none of the other 1 holds" in with_open
    assert with_open.endswith(
        ", and 1 stays open: prefetch hides communication (needs an FSDP trace from 2+ GPUs)."
    )


@pytest.mark.skipif(not sc.GPU_TRACE.is_file(), reason="needs ../shared/traces")
def test_prefetch_claim_stays_open_with_the_real_trace_as_evidence():
    j = sc.prefetch_overlap()
    assert j.verdict == "open: needs an FSDP trace from 2+ GPUs" and j.seed == sc.SEED1
    assert 84 < j.values["ddp_exposed_pct"] < 86  # the real DDP run hides ~15 % of its NCCL time
    assert f"{j.values['ddp_exposed_pct']:.0f} % of its NCCL time is exposed" in j.evidence
    absent = sc.prefetch_overlap(Path("/nonexistent/trace.json.gz"))
    assert "is absent" in absent.evidence and absent.values == {}


def test_book_recipe_table_reads_as_text():
    t = sc.book_recipe_table()
    col = t.iloc[:, 0]
    assert col["tokens per GPU per micro-batch"] == "4,096" and col["activation checkpointing"] == "on"
    assert col["FSDP version"] == "FSDP1" and col["LoRA"] == "no (full fine-tune)"
