"""HSDP: 4 gloo ranks as a 2 x 2 mesh (replicate x shard), FSDP2 and FSDP1 HYBRID_SHARD.

What is shown, with values: each rank holds half of every parameter (not a quarter); one step on the
full batch split over the 4 ranks gives the gradients of one process on that batch; gradients are
reduce-scattered inside the shard group {0, 1} / {2, 3} and all-reduced across the replicate group
{0, 2} / {1, 3}, so replicas that saw different rows hold identical shards after the optimizer step.
"""

import math

import pytest
import torch
from _dist import run_distributed
from test_gradients import _clean, _reference, _rows

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch.validate import validate
from smolfsdp.sharding.fsdp1 import hf_fsdp_config, pin_plugin_sharding_strategy
from smolfsdp.sharding.fsdp2 import resolve_mesh_shape

WORLD, REPLICATE, SHARD = 4, 2, 2
COLLECTIVES = (
    "all_reduce",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "all_gather_single",
    "all_gather",
)


class _Recorder:
    """Record (collective, ranks of its process group) for every c10d call FSDP makes."""

    def __enter__(self):
        import torch.distributed as dist

        self.calls, self._orig = [], {}
        for name in COLLECTIVES:
            fn = self._orig[name] = getattr(dist, name)

            def wrapped(*args, _fn=fn, _name=name, **kwargs):
                groups = [a for a in (*args, kwargs.get("group")) if isinstance(a, dist.ProcessGroup)]
                group = groups[0] if groups else dist.group.WORLD  # passed positionally or by keyword
                self.calls.append((_name, tuple(dist.get_process_group_ranks(group))))
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        for name, fn in self._orig.items():
            setattr(dist, name, fn)


def _hsdp_rank(rank, world, version):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.models.modeling import (
        build_model,
        count_parameters,
        decoder_layers,
        load_tokenizer,
        resolve_wrap_class,
    )
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.sharding.fsdp2 import build_mesh
    from smolfsdp.train.native import shard_model
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    rows = _rows(tok)  # 4 rows of different lengths: each rank gets a different one
    model = build_model("tiny", tok, seed=0)
    layers = decoder_layers(model, resolve_wrap_class(model))
    layer_numels = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    total = count_parameters(model)
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    cfg = TrainConfig(
        fsdp_version=version, nproc=WORLD, sharding_strategy="HYBRID_SHARD", replicate_size=REPLICATE
    )
    model, evidence = shard_model(model, cfg, info)
    out = {"evidence": evidence, "total": total}
    try:
        build_mesh("cpu", 3, 2)  # 6 ranks asked, 4 present
    except ConfigError as err:
        out["mesh_error"] = str(err)
    if version == 2:
        out["params"] = [
            (n, tuple(p.placements), tuple(p.to_local().shape), tuple(p.shape), p.device_mesh.mesh_dim_names)
            for n, p in model.named_parameters()
        ]
    else:
        from smolfsdp.sharding.fsdp1 import fsdp_units

        units = [u for u in fsdp_units(model) if u._flat_param is not None]
        # unit order: the root (embedding, final norm, tied lm_head) first, then one unit per layer
        out["unit_numels"] = [total - sum(layer_numels), *layer_numels]
        out["flat_numels"] = [u._flat_param.numel() for u in units]
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)([rows[rank]])
    with _Recorder() as rec:
        out["loss"], out["n_items"] = forward_backward(model, [batch], world, info.device)
    out["calls"] = rec.calls
    grads = {}
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        with FSDP.summon_full_params(model, with_grads=True):
            grads = {_clean(n): p.grad.detach().clone() for n, p in model.named_parameters()}
    else:
        grads = {_clean(n): p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
    out["grads"] = grads
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer.step()
    if version == 2:
        out["shards_after_step"] = [p.to_local().detach().clone() for p in model.parameters()]
    else:
        out["shards_after_step"] = [u._flat_param.detach().clone() for u in units]
    return out


@pytest.fixture(scope="module", params=[2, 1], ids=["fsdp2", "fsdp1-hybrid_shard"])
def hsdp(request):
    return request.param, run_distributed(_hsdp_rank, WORLD, request.param)


def _groups(rank):
    shard = tuple(range(rank // SHARD * SHARD, rank // SHARD * SHARD + SHARD))  # mesh row: (0, 1) or (2, 3)
    replicate = tuple(range(rank % SHARD, WORLD, SHARD))  # mesh column: (0, 2) or (1, 3)
    return shard, replicate


def test_mesh_is_2x2_and_each_rank_holds_half(hsdp):
    version, results = hsdp
    for r in results:
        ev = r["evidence"]
        assert ev["sharding_strategy"] == "HYBRID_SHARD"
        assert ev["mesh_shape"] == [REPLICATE, SHARD] and ev["mesh_dim_names"] == ["dp_replicate", "dp_shard"]
        assert ev["fsdp_units"] == 5  # 4 decoder layers + the root
        if version == 2:
            from torch.distributed.tensor import Replicate, Shard

            for name, placements, local, full, dims in r["params"]:
                assert placements == (Replicate(), Shard(0)), name
                assert dims == ("dp_replicate", "dp_shard")
                assert full[0] % SHARD == 0 and local == (full[0] // SHARD, *full[1:]), name
            assert ev["local_numel"] == r["total"] // SHARD == 434_752  # half of 869,504, not a quarter
        else:
            # each unit's FlatParameter is split over the 2 ranks of its shard group (padding rounds up)
            assert r["flat_numels"] == [math.ceil(n / SHARD) for n in r["unit_numels"]]
            assert r["flat_numels"] == [65_600, 92_288, 92_288, 92_288, 92_288]
            assert ev["local_numel"] == sum(r["flat_numels"])
    assert "a mesh of 2 x 3 = 6 ranks is larger than the world size 4" in results[0]["mesh_error"]


def test_gradients_equal_single_process_full_batch(hsdp):
    _, results = hsdp
    reference = _reference(lora=False)
    for r in results:
        assert r["loss"] == pytest.approx(reference["loss"], rel=1e-5)  # every rank reports the global mean
        assert set(r["grads"]) == set(reference["grads"])
        for name, ref in reference["grads"].items():
            torch.testing.assert_close(
                r["grads"][name], ref, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
            )


def test_reduce_scatter_in_the_shard_group_all_reduce_across_replicas(hsdp):
    version, results = hsdp
    for rank, r in enumerate(results):
        shard, replicate = _groups(rank)
        by_group = {}
        for name, ranks in r["calls"]:
            by_group.setdefault((name.split("_single")[0].replace("_tensor", ""), ranks), 0)
            by_group[(name.split("_single")[0].replace("_tensor", ""), ranks)] += 1
        assert by_group[("reduce_scatter", shard)] == 5  # one per FSDP unit, inside the shard group
        assert by_group[("all_reduce", replicate)] == 5  # then one per unit across the replicas
        assert by_group[("all_reduce", (0, 1, 2, 3))] == 2  # forward_backward's label-token count and loss
        assert {k for k in by_group if k[0] == "all_gather"} == {("all_gather", shard)}
        assert {g for (_, g) in by_group} == {shard, replicate, (0, 1, 2, 3)}


def test_replicas_hold_identical_shards_after_a_step(hsdp):
    _, results = hsdp
    a, b, other = (
        results[0]["shards_after_step"],
        results[2]["shards_after_step"],
        results[1]["shards_after_step"],
    )
    assert len(a) == len(b) > 0
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # ranks 0 and 2 saw different rows
    assert not all(
        x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, other, strict=True)
    )  # other half


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (
            {"sharding_strategy": "HYBRID_SHARD", "replicate_size": 2, "shard_size": 4},
            "the mesh 2 x 4 (replicate_size x shard_size) = 8 ranks does not match the world size 4",
        ),
        (
            {"sharding_strategy": "HYBRID_SHARD", "replicate_size": 3},
            "replicate_size=3 does not divide the world size 4",
        ),
        (
            {"sharding_strategy": "HYBRID_SHARD", "shard_size": 3},
            "shard_size=3 does not divide the world size 4",
        ),
        ({"replicate_size": 2}, "set sharding_strategy: HYBRID_SHARD"),
        ({"sharding_strategy": "NO_SHARD", "shard_size": 2}, "NO_SHARD keeps whole parameters"),
        ({"sharding_strategy": "hybrid"}, "Did you mean 'HYBRID_SHARD'?"),
        ({"sharding_strategy": "HYBRID_SHARD", "replicate_size": 0}, "replicate_size=0 must be >= 1"),
        ({"engine": "trl", "fsdp_version": 2, "sharding_strategy": "HYBRID_SHARD"}, "ParallelismConfig"),
        (
            {"engine": "trl", "sharding_strategy": "HYBRID_SHARD", "replicate_size": 2},
            "builds the HYBRID_SHARD",
        ),
    ],
)
def test_bad_mesh_is_refused_at_config_time(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig(nproc=4, **kwargs))  # the run-start check (launch.validate), before any work
    assert needle in str(err.value)


def test_mesh_shapes_per_strategy():
    assert resolve_mesh_shape("FULL_SHARD", 4) == (1, 4)
    assert resolve_mesh_shape("SHARD_GRAD_OP", 4) == (1, 4)
    assert resolve_mesh_shape("NO_SHARD", 4) == (4, 1)
    assert resolve_mesh_shape("HYBRID_SHARD", 4, replicate_size=2) == (2, 2)
    assert resolve_mesh_shape("HYBRID_SHARD", 16, shard_size=8) == (2, 8)
    # nothing given: shard over a node's processes, replicate across nodes (FSDP1's own default)
    assert resolve_mesh_shape("HYBRID_SHARD", 16, local_world_size=8) == (2, 8)
    assert TrainConfig().sharding_strategy == "FULL_SHARD"  # today's behaviour is the default


def test_trainer_fsdp1_gets_hybrid_shard():
    """The Trainer path: the key transformers 5.24 reads, and what accelerate 1.15 would wrap with."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import ShardingStrategy
    from transformers import TrainingArguments

    cfg = hf_fsdp_config(1, "SmolLM3DecoderLayer", sharding_strategy="HYBRID_SHARD", sync_module_states=False)
    assert cfg["reshard_after_forward"] == "hybrid_shard"
    assert hf_fsdp_config(2, sharding_strategy="SHARD_GRAD_OP")["reshard_after_forward"] is False
    with pytest.raises(ConfigError, match="reshard_after_forward true/false"):
        hf_fsdp_config(2, sharding_strategy="HYBRID_SHARD")
    args = TrainingArguments(output_dir="/tmp/smolfsdp-hsdp-args", fsdp=True, fsdp_config=cfg, use_cpu=True)
    assert args.fsdp_plugin_args["reshard_after_forward"] == "hybrid_shard"

    def wraps_with(plugin_args):  # Accelerator.prepare_model: sharding_strategy or reshard_after_forward
        plugin = FullyShardedDataParallelPlugin(**plugin_args)
        return plugin.sharding_strategy or plugin.reshard_after_forward

    assert wraps_with(args.fsdp_plugin_args) == ShardingStrategy.FULL_SHARD  # accelerate's default wins
    assert wraps_with(pin_plugin_sharding_strategy(args).fsdp_plugin_args) == ShardingStrategy.HYBRID_SHARD


def test_torchrun_hsdp_run_reports_its_mesh(tmp_path):
    """One real run: `smolfsdp train` on 4 processes, FSDP2 on a 2 x 2 mesh, to the end."""
    from smolfsdp.launch import runner

    cfg = TrainConfig(
        name="hsdp",
        output_dir=str(tmp_path),
        nproc=WORLD,
        fsdp_version=2,
        sharding_strategy="HYBRID_SHARD",
        replicate_size=REPLICATE,
        max_steps=3,
        eval_steps=0,
        max_length=96,
        too_long="truncate",
        per_device_train_batch_size=2,
    )
    s = runner.run(cfg, capture=True, timeout=600).summary
    assert s["world_size"] == WORLD and s["metrics"]["steps"] == 3
    assert s["requested"]["sharding_strategy"] == "HYBRID_SHARD"
    ev = s["effective"]["evidence"]
    assert ev["mesh_shape"] == [2, 2] and ev["mesh_dim_names"] == ["dp_replicate", "dp_shard"]
    assert s["params"]["fraction_per_rank"] == [0.5] * WORLD
    assert (tmp_path / "hsdp" / "final_model" / "model.safetensors").is_file()


def _other_strategies(rank, world):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.models.modeling import build_model, load_tokenizer
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.train.native import shard_model
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)([_rows(tok)[rank]])
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = {}
    for version in (1, 2):
        for strategy in ("NO_SHARD", "SHARD_GRAD_OP"):
            cfg = TrainConfig(fsdp_version=version, sharding_strategy=strategy)
            model, ev = shard_model(build_model("tiny", tok, seed=0), cfg, info)
            loss, _ = forward_backward(model, [batch], world, info.device)
            out[(version, strategy)] = {**ev, "loss": loss}
    return out


def test_no_shard_and_shard_grad_op_on_both_versions():
    """NO_SHARD: every rank holds the whole model (FSDP2: a world x 1 mesh); SHARD_GRAD_OP: half,
    without resharding after forward (FSDP2: reshard_after_forward=False)."""
    got = run_distributed(_other_strategies, 2)[0]
    total = 869_504
    for version in (1, 2):
        no_shard, zero2 = got[(version, "NO_SHARD")], got[(version, "SHARD_GRAD_OP")]
        assert no_shard["local_numel"] == total and no_shard["mesh_shape"] == [2, 1]
        assert zero2["local_numel"] == total // 2 and zero2["mesh_shape"] == [2]
        assert zero2["reshard_after_forward"] is False
        assert no_shard["loss"] == pytest.approx(zero2["loss"], rel=1e-6)
    assert got[(2, "NO_SHARD")]["mesh_dim_names"] == ["dp_replicate", "dp_shard"]


def test_hsdp_checkpoint_stop_and_resume_equals_uninterrupted(tmp_path):
    """DCP checkpoints of a 2x2 HSDP mesh (DTensors placed (Replicate(), Shard(0))): stopped after step 2
    of 4 and resumed, the final model is bitwise the uninterrupted run's."""
    from smolfsdp.book.drills_view import drill_table
    from smolfsdp.probes.drills import resume_drill

    cfg = TrainConfig(
        name="hsdp_drill", output_dir=str(tmp_path), nproc=4, fsdp_version=2, sharding_strategy="HYBRID_SHARD",
        replicate_size=2, max_steps=4, eval_steps=0, per_device_train_batch_size=2, max_length=128,
        too_long="truncate",
    )  # fmt: skip
    out = resume_drill(cfg, stop_at=2)
    assert out["strategy"] == "fsdp2" and out["steps"] == 4
    assert out["resumed_from"].endswith("step-000002")
    assert out["tensors"] == 38 and out["max_abs_diff"] == 0.0
    table = drill_table([out], root=tmp_path)  # the chapter's table of it
    assert table.loc["native engine: stopped, then --resume_from latest", "resumed from (checkpoint)"] == (
        "hsdp_drill_resumed/checkpoints/step-000002"
    )
