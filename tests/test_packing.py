"""Packing and padding-free batches (``smolfsdp.data.packing``): rows stay apart, the loss per real token is the
padded batch's, every row is accounted for, and both engines train packed on 2 CPU ranks.

The rows are the bundled sample's first ones tokenised at ``max_length`` 1024 (180-234 tokens each), so TRL's
BFD puts four of them in one packed row.
"""

import pytest
import torch
from _dist import run_distributed

from smolfsdp.config import TrainConfig, load_config
from smolfsdp.data.packing import (
    attention_seq_len,
    build_collator,
    check_rows_apart,
    count_computed_tokens,
    count_real_tokens,
    pack_rows,
    packing_stats,
)
from smolfsdp.data.prepare import prepare_data
from smolfsdp.errors import ConfigError
from smolfsdp.estimate.packed import masked_attention_bytes
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.launch import runner
from smolfsdp.models.modeling import build_model, load_tokenizer
from smolfsdp.paths import repo_root
from smolfsdp.train.batches import count_label_tokens
from smolfsdp.train.steps import NO_CACHE, micro_batch_backward

N_ROWS = 4
MAX_LENGTH = 1024
PADDED, PACKED = TrainConfig(), TrainConfig(packing=True)
ROOT = repo_root()


def _data(tok, n=N_ROWS):
    return prepare_data(TrainConfig(eval_size=0, max_rows=n, max_length=MAX_LENGTH), tok).train


def _rows(ds):
    return [ds[i] for i in range(len(ds))]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_row_logits_equal_each_row_run_alone(tok, attn):
    """The "no row attends to another" proof: the logits of one packed, flattened row are, row by row, the
    logits of each row run alone (fp32); with the KV cache on (SmolLM3's config default) or an attention mask of
    ones, the same batch lets the rows see each other and the logits move."""
    ds = _data(tok)
    packed = pack_rows(ds, MAX_LENGTH)
    lengths = packed[0]["seq_lengths"]  # BFD: longest first
    assert len(packed) == 1 and sorted(lengths) == sorted(len(r) for r in ds["input_ids"])  # 4 rows in 1
    rows = list(torch.tensor(packed[0]["input_ids"]).split(lengths))
    assert sorted(r.tolist() for r in rows) == sorted(ds["input_ids"])  # each one of the rows, whole
    batch = build_collator(tok.pad_token_id, PACKED)(_rows(packed))
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, sum(packed[0]["seq_lengths"]))
    model = build_model("tiny", tok, seed=0).eval()
    model.config._attn_implementation = attn
    with torch.no_grad():
        alone = torch.cat([model(input_ids=r[None], **NO_CACHE).logits[0] for r in rows])
        inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
        together = model(**inputs, **NO_CACHE).logits[0]
        with_cache = model(**inputs, use_cache=True).logits[0]
        with_mask = model(**inputs, attention_mask=torch.ones_like(batch["input_ids"]), **NO_CACHE).logits[0]
    assert torch.allclose(together, alone, atol=1e-5, rtol=0), (together - alone).abs().max()
    first = lengths[0]  # the first row sees nothing before it either way; the others do
    for leaked in (with_cache, with_mask):
        assert torch.allclose(leaked[:first], alone[:first], atol=1e-5, rtol=0)
        assert (leaked[first:] - alone[first:]).abs().max() > 0.1


def test_loss_per_real_token_packed_equals_padded(tok):
    """One process, a fixed batch: the padded micro-batch and the packed one have the same label tokens, the
    same loss per label token (to 1e-5) and the same gradients; the padded one computes padding, the packed none."""
    ds = _data(tok)
    padded = build_collator(tok.pad_token_id, PADDED)(_rows(ds))
    packed = build_collator(tok.pad_token_id, PACKED)(_rows(pack_rows(ds, MAX_LENGTH)))
    n_items = count_label_tokens(padded)
    assert count_label_tokens(packed) == n_items > 0
    real = sum(len(r) for r in ds["input_ids"])
    assert count_real_tokens(padded) == count_real_tokens(packed) == real
    assert (
        count_computed_tokens(packed)
        == real
        < count_computed_tokens(padded)
        == N_ROWS * padded["input_ids"].shape[1]
    )
    out = {}
    for name, batch in (("padded", padded), ("packed", packed)):
        model = build_model("tiny", tok, seed=0)
        loss = micro_batch_backward(model, batch, 1, torch.device("cpu"), n_items)
        out[name] = (float(loss), {n: p.grad.clone() for n, p in model.named_parameters()})
    assert out["packed"][0] == pytest.approx(out["padded"][0], abs=1e-5)
    for n, g in out["padded"][1].items():
        assert torch.allclose(out["packed"][1][n], g, atol=1e-5, rtol=1e-4), n


def _two_rank_losses(rank, world):
    """One FSDP2 step of the native engine's arithmetic (``forward_backward``) on a fixed batch, padded then
    packed, from the same seeded model: rank r holds rows 2r and 2r+1."""
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.train.native import shard_model
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    ds = _data(tok).select([2 * rank, 2 * rank + 1])
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = {}
    for cfg in (
        TrainConfig(fsdp_version=2, nproc=world),
        TrainConfig(fsdp_version=2, nproc=world, packing=True),
    ):
        model, _ = shard_model(build_model("tiny", tok, seed=0), cfg, info)
        rows = _rows(pack_rows(ds, MAX_LENGTH)) if cfg.packing else _rows(ds)
        micro = [build_collator(tok.pad_token_id, cfg)(rows)]
        out["packed" if cfg.packing else "padded"] = forward_backward(model, micro, world, info.device)
    return out


def test_two_rank_loss_per_real_token_packed_equals_padded():
    r0 = run_distributed(_two_rank_losses, 2)[0]
    (padded, n_padded), (packed, n_packed) = r0["padded"], r0["packed"]
    assert n_packed == n_padded > 0  # the same label tokens over both ranks
    assert packed == pytest.approx(padded, abs=1e-5)


def test_packing_accounts_for_every_row_and_token(tok):
    ds = _data(tok, 12)
    packed = pack_rows(ds, MAX_LENGTH)
    s = packing_stats(ds, packed, MAX_LENGTH)
    real = sum(len(r) for r in ds["input_ids"])
    assert s["rows"] == s["rows_in_packed"] == len(ds) and s["real_tokens"] == real
    assert s["packed_rows"] == len(packed) < len(ds) / 3  # rows of ~200 tokens: four or more per packed row
    assert s["packing_fill"] == round(real / (len(packed) * MAX_LENGTH), 4) and 0.5 < s["packing_fill"] <= 1
    assert all(sum(r) <= MAX_LENGTH for r in packed["seq_lengths"])
    batch = build_collator(tok.pad_token_id, PACKED)(_rows(packed.select([0])))
    lengths = packed[0]["seq_lengths"]  # attention FLOPs go with each row's own length, not the flat row's
    assert attention_seq_len(batch) == pytest.approx(sum(n * n for n in lengths) / sum(lengths))


def test_refusals(tok):
    with pytest.raises(ConfigError, match="packing: true with attn_implementation='kernels-community/x:fn'"):
        TrainConfig(packing=True, attn_implementation="kernels-community/x:fn")
    with pytest.raises(ConfigError, match="padding_free: true"):
        TrainConfig(padding_free=True, attn_implementation="kernels-community/x:fn")
    TrainConfig(attn_implementation="kernels-community/x:fn")  # padded batches carry their own mask
    ds = _data(tok)
    batch = build_collator(tok.pad_token_id, PACKED)(_rows(pack_rows(ds, MAX_LENGTH)))
    with pytest.raises(ValueError, match="rows would attend to each other"):
        check_rows_apart({**batch, "attention_mask": torch.ones_like(batch["input_ids"])})
    check_rows_apart(batch)
    with pytest.raises(ConfigError, match="longer than max_length=100"):
        pack_rows(ds, 100)


#: (engine, collation, rows per micro-batch): packed on both engines, padding-free alone on TRL (whose SFTConfig
#: needs max_length=None for it, data.packing.sft_collation_args), and padded for the share padding costs
RUNS = [("native", "packed", 1), ("trl", "packed", 1), ("trl", "padding_free", 4), ("native", "padded", 4)]


@pytest.mark.parametrize("engine,collation,batch", RUNS)
def test_two_rank_run_reports_packed_rows_and_real_token_share(tmp_path, engine, collation, batch):
    cfg = load_config(
        ROOT / "configs/runs/smoke_packed.yaml",  # the packed smoke recipe, cut to one short epoch
        name=f"{engine}_{collation}",
        output_dir=str(tmp_path),
        engine=engine,
        packing=collation == "packed",
        padding_free=collation == "padding_free",
        max_rows=44,
        eval_size=4,
        per_device_train_batch_size=batch,
        num_train_epochs=1,
        eval_steps=0,
        save_final_model=False,
    )
    assert cfg.max_length == MAX_LENGTH
    s = runner.run(cfg, capture=True, timeout=600).summary
    data, m = s["data"], s["metrics"]
    assert data["collation"] == collation and data["train_tokens_real"] == m["tokens"] > 0
    share = data["train_tokens_real"] / data["train_tokens_computed"]
    assert data["real_token_share"] == round(share, 4)
    if collation == "packed":
        train = data["packing"]["train"]
        assert train["rows"] == data["train_rows"] == train["rows_in_packed"]
        assert train["packed_rows"] < train["rows"] / 3
        assert m["steps"] == train["packed_rows"] // 2  # steps per epoch follow the packed rows (1 x 2 ranks)
        assert data["real_token_share"] == 1.0  # no padding computed
        assert data["eval_rows"] == data["packing"]["eval"]["rows_in_packed"] == 4
    elif collation == "padding_free":  # the same rows per step as padded, none of the padding
        assert "packing" not in data and m["steps"] == data["train_rows"] // 8
        assert data["real_token_share"] == 1.0
    else:  # 4 rows of 180-234 tokens per micro-batch, each padded to its longest
        assert "packing" not in data and m["steps"] == data["train_rows"] // 8
        assert 0.7 < data["real_token_share"] < 1.0


def _saved_bytes(model, **inputs) -> int:
    """Bytes of the distinct storages autograd saves for backward in one training forward (weights left out)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.train()(**inputs, **NO_CACHE)
    return sum(saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_path_bytes_equal_saved_tensors(tok, dtype):
    """A packed row takes SDPA's masked path: per layer the expanded K and V and the additive mask, byte for byte
    what ``estimate.packed.masked_attention_bytes`` counts beyond the same tokens in one unmasked row."""
    model = build_model("tiny", tok, dtype=dtype)
    ids = torch.randint(0, len(tok), (1, 256), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(100), torch.arange(156)])[None]
    extra = _saved_bytes(model, input_ids=ids, labels=ids, position_ids=pos) - _saved_bytes(
        model, input_ids=ids, labels=ids
    )
    c = torch.finfo(dtype).bits // 8
    assert extra == model.config.num_hidden_layers * masked_attention_bytes(model.config, 1, 256, c) > 0


def test_estimator_and_dry_run_size_the_packed_row():
    """The estimator already sizes ``micro_batch x max_length`` tokens per micro-batch (every row full): a packed
    micro-batch is those tokens in one row, so what changes is the masked path, one layer's worth under activation
    checkpointing; the dry run traces that row (one flattened row, positions restarting) and the extra it traces is
    the extra the estimate adds, to the byte."""
    from smolfsdp.audit.dryrun.dry_run import dry_run, micro_batches
    from smolfsdp.estimate.memory import estimate_memory
    from smolfsdp.estimate.recipe_peak import recipe_settings

    base = dict(model="tiny", max_length=128, per_device_train_batch_size=2, fsdp_version=2, nproc=2)
    padded, packed = TrainConfig(**base), TrainConfig(**base, packing=True)
    (b_pad,), (b_pack,) = micro_batches(padded, 1024), micro_batches(packed, 1024)
    assert b_pad["input_ids"].shape == (2, 128) and b_pack["input_ids"].shape == (1, 256)
    assert b_pack["position_ids"][0].tolist() == list(range(128)) * 2
    settings = recipe_settings(packed)
    assert settings["packing"] and settings["seq_len"] * settings["micro_batch"] == 256
    assert not recipe_settings(
        TrainConfig(**base, packing=True, attn_implementation="flash_attention_2", mixed_precision="bf16")
    )["packing"]
    est = {p: estimate_memory(**recipe_settings(padded, packing=p)) for p in (False, True)}
    extra, layers = masked_attention_bytes("tiny", 1, 256, 4), resolve_model_config("tiny").num_hidden_layers
    diff_no_ac = est[True].activations_no_ac_bytes - est[False].activations_no_ac_bytes
    diff_ac = est[True].activations_ac_bytes - est[False].activations_ac_bytes
    assert diff_no_ac - diff_ac == (layers - 1) * extra > 0  # checkpointing keeps one layer's recompute only
    traced = {p: dry_run(TrainConfig(**base, packing=p), world_size=2) for p in (False, True)}
    assert traced[True].setup["packing"] and "packing" not in traced[False].setup
    assert traced[True].peak_bytes - traced[False].peak_bytes == diff_no_ac  # traced extra == estimated extra


def test_the_cli_line_says_packed_rows_and_the_share():
    from smolfsdp.cli_output import format_data

    data = {"rows_in": 180, "kept": 180, "train_rows": 162, "eval_rows": 18, "mapping": "medical_o1",
            "packing": {"train": {"packed_rows": 41, "packing_fill": 0.9712}}, "real_token_share": 1.0}  # fmt: skip
    line = format_data(data)
    assert "162 train / 18 eval (train packed into 41 rows, 97.1% full)" in line
    assert "100.0% of the tokens computed were real" in line
