"""``lora_layout: adapter-units``: each LoRA adapter its own FSDP1 unit (fsdp_qlora / llama-recipes), held to
the in-unit layout, a single process and the memory estimate.

One spawn of 2 gloo ranks checks the wrap, the gradients (fp32, and bf16 with activation checkpointing) and a
DCP save/load; the dry run (tiny model, fake world) checks the estimate and the bytes the layout saves.
"""

import pytest
import torch
from _dist import run_distributed
from test_gradients import N_ROWS, _clean, _model, _reference, _rows
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from smolfsdp.config import TrainConfig, load_config
from smolfsdp.errors import ConfigError
from smolfsdp.models.modeling import load_tokenizer

N_LAYERS, N_TARGETS = 4, 4  # the tiny SmolLM3; q, k, v, o


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"lora_layout": "adapters"}, "use one of"),
        ({"lora_layout": "adapter-units"}, "set lora: true"),
        ({"lora_layout": "adapter-units", "lora": True, "fsdp_version": 2}, "set fsdp_version: 1"),
        ({"lora_layout": "adapter-units", "engine": "trl"}, "set lora: true"),
    ],
)
def test_layout_refused_where_it_cannot_run(kw, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kw)


def test_layout_refused_on_trl_engine():
    from smolfsdp.lora_options import check_lora_layout

    with pytest.raises(ConfigError, match="native engine only"):
        check_lora_layout("adapter-units", lora=True, fsdp_version=1, engine="trl")


def test_lora_fsdp1_needs_use_orig_params_in_both_layouts():
    for layout in ("in-unit", "adapter-units"):
        with pytest.raises(ConfigError, match="use_orig_params"):
            TrainConfig(lora=True, lora_layout=layout, use_orig_params=False)


def _gathered_grads(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, with_grads=True):
        return {_clean(n): p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _units(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [
        (type(u.module).__name__, u._flat_param.requires_grad, u._flat_param.grad is not None)
        for u in FSDP.fsdp_modules(model)
        if getattr(u, "_flat_param", None) is not None
    ]


def _two_ranks(rank, world, out_dir):
    import torch.distributed as dist

    from smolfsdp.checkpoint import dcp
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.sharding.lora import gather_adapter
    from smolfsdp.train.native import make_optimizer, make_scheduler, shard_model
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    rows = _rows(tok)
    per = N_ROWS // world
    micro = [
        DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(rows[rank * per : (rank + 1) * per])
    ]
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = {}
    for name, kw in {
        "fp32": {},
        "bf16-ac": {"mixed_precision": "bf16", "activation_checkpointing": True},
        "in-unit": {"lora_layout": "in-unit"},
    }.items():
        cfg = TrainConfig(fsdp_version=1, lora=True, nproc=world, **{"lora_layout": "adapter-units", **kw})
        model, evidence = shard_model(_model(tok, True), cfg, info)
        loss, _ = forward_backward(model, micro, world, info.device)
        out[name] = {"loss": loss, "units": _units(model), "fsdp_units": evidence["fsdp_units"]}
        out[name]["grads"] = _gathered_grads(model)
        if name == "fp32":  # one step, a DCP save, a fresh model loaded from it: the same adapters
            opt = make_optimizer(model, cfg)
            sched = make_scheduler(opt, cfg, 4)
            opt.step()
            path = dcp.save_checkpoint(out_dir, 1, model, opt, sched, {"epoch": 0, "consumed": 0}, rank)
            fresh, _ = shard_model(_model(tok, True), cfg, info)
            fresh_opt = make_optimizer(fresh, cfg)
            dcp.load_checkpoint(path, fresh, fresh_opt, make_scheduler(fresh_opt, cfg, 4))
            out[name]["saved"], out[name]["loaded"] = gather_adapter(model, info), gather_adapter(fresh, info)
            out[name]["exp_avg"] = [
                sorted(float(s["exp_avg"].abs().sum()) for s in o.state.values()) for o in (opt, fresh_opt)
            ]
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_distributed(_two_ranks, 2, str(tmp_path_factory.mktemp("ckpt")), timeout=300)


def test_each_adapter_is_its_own_unit_and_the_base_has_no_gradient(two_ranks):
    for name in ("fp32", "bf16-ac"):
        units = two_ranks[0][name]["units"]
        layers = [u for u in units if u[0] == "SmolLM3DecoderLayer"]
        adapters = [u for u in units if u[0] == "Linear"]
        assert len(layers) == N_LAYERS and all(u[1:] == (False, False) for u in layers)  # frozen, no .grad
        assert len(adapters) == N_LAYERS * N_TARGETS * 2 and all(
            u[1:] == (True, True) for u in adapters
        )  # A and B
        assert len(units) == two_ranks[0][name]["fsdp_units"] == N_LAYERS + len(adapters) + 1  # + the root
        assert units[0][1:] == (False, False)  # the root: embeddings and final norm, frozen
    in_unit = two_ranks[0]["in-unit"]["units"]
    assert (
        len(in_unit) == N_LAYERS + 1 and sum(u[1] for u in in_unit) == N_LAYERS
    )  # each layer with a gradient


def test_gradients_equal_in_unit_and_single_process(two_ranks):
    reference = _reference(lora=True)
    got, in_unit = two_ranks[0]["fp32"], two_ranks[0]["in-unit"]
    assert got["loss"] == pytest.approx(reference["loss"], rel=1e-5) == in_unit["loss"]
    assert set(got["grads"]) == set(reference["grads"]) == set(in_unit["grads"])
    assert len(got["grads"]) == N_LAYERS * N_TARGETS * 2
    for name, ref in reference["grads"].items():
        torch.testing.assert_close(got["grads"][name], ref, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got["grads"][name], in_unit["grads"][name], rtol=1e-5, atol=1e-7)
    # bf16 compute with activation checkpointing: within bf16's precision of the fp32 gradients
    for name, ref in reference["grads"].items():
        err = (two_ranks[0]["bf16-ac"]["grads"][name] - ref).norm() / ref.norm()
        assert err < 0.05, (name, float(err))


def test_sharded_checkpoint_round_trips(two_ranks):
    r = two_ranks[0]["fp32"]
    assert len(r["saved"]) == N_LAYERS * N_TARGETS * 2
    for key, tensor in r["saved"].items():
        torch.testing.assert_close(r["loaded"][key], tensor, rtol=0, atol=0)
    assert r["exp_avg"][0] == r["exp_avg"][1] and sum(r["exp_avg"][0]) > 0


def _dry(layout: str):
    from smolfsdp.audit.dryrun.compare import compare_with_estimate, estimate_for
    from smolfsdp.audit.dryrun.dry_run import dry_run

    cfg = load_config("configs/runs/lora_smoke.yaml", fsdp_version=1, lora_layout=layout, max_length=128)
    report = dry_run(cfg, world_size=2)
    return report, compare_with_estimate(report, cfg).set_index("component"), estimate_for(cfg, 2)


def test_dry_run_within_3pct_and_saves_the_base_gradient():
    units, in_unit = _dry("adapter-units"), _dry("in-unit")
    assert units[0].setup["lora_layout"] == "adapter-units"
    assert units[0].setup["wrap"]["fsdp_units"] == 1 + N_LAYERS * (1 + N_TARGETS * 2)
    for _, table, _ in (units, in_unit):
        assert (table["error_pct"].abs() < 3).all(), table
    saved_traced = in_unit[0].held_bytes["grad_bytes"] - units[0].held_bytes["grad_bytes"]
    saved_estimated = in_unit[2].grads_bytes - units[2].grads_bytes
    assert saved_traced > 0 and saved_estimated == pytest.approx(saved_traced, rel=0.03)
    assert units[0].peak_bytes < in_unit[0].peak_bytes
    from smolfsdp.cli_dryrun import format_dryrun

    assert (
        "LoRA (each adapter its own FSDP unit)"
        in format_dryrun(units[0], units[1].reset_index()).split("\n")[0]
    )


@pytest.mark.parametrize("command", ["train", "dryrun"])
def test_cli_takes_the_layout_as_a_run_option(command):
    from smolfsdp.cli import build_parser
    from smolfsdp.cli_args import overrides_from

    args = build_parser().parse_args([command, "--lora", "--lora_layout", "adapter-units"])
    assert overrides_from(args) == {"lora": True, "lora_layout": "adapter-units"}
    assert load_config(None, **overrides_from(args)).lora_layout == "adapter-units"
