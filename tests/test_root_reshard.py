"""FSDP2's root group stays gathered from forward to backward by default: 2L + 1 all-gathers per step.

``apply_fsdp2`` used to pass ``reshard_after_forward=True`` to the root too, which made torch reshard it
after forward and all-gather it again at once for backward (2L + 2 = 10 for the tiny model's 4 layers).
"""

import pytest
import torch
from _dist import run_distributed

from smolfsdp.measure.comm import estimate_collectives
from smolfsdp.measure.memory import resolve_model_config


def _step_collectives(rank, world, root_reshard):
    from torch.distributed.tensor import DTensor
    from torch.profiler import ProfilerActivity, profile

    from smolfsdp.book.mechanics import collective_kind
    from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh
    from smolfsdp.train.native import PadCollator

    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    kwargs = {} if root_reshard is None else {"root_reshard_after_forward": root_reshard}
    apply_fsdp2(model, build_mesh("cpu", world), resolve_wrap_class(model), **kwargs)
    ids = list(range(1, 33))
    batch = PadCollator(tok.pad_token_id)([{"input_ids": ids, "labels": ids}] * 2)
    losses, between = [], []
    for _ in range(2):  # the second step is the profiled one (lazy init is done)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = model(**batch)
            between.append(isinstance(model.lm_head.weight, DTensor))
            out.loss.backward()
        losses.append(float(out.loss))
        model.zero_grad(set_to_none=True)
    kinds = [collective_kind(e.name) for e in prof.events()]
    return {
        "all_gathers": kinds.count("all-gather"),
        "reduce_scatters": kinds.count("reduce-scatter"),
        "root_sharded_between": between[-1],
        "loss": losses[-1],
        "n_layers": len(model.model.layers),
    }


@pytest.fixture(scope="module")
def measured():
    return {flag: run_distributed(_step_collectives, 2, flag) for flag in (None, True)}


def test_default_keeps_the_root_gathered_for_backward(measured):
    for r in measured[None]:
        n = r["n_layers"]
        assert r["all_gathers"] == 2 * n + 1  # every layer twice, the root once: 9 for 4 layers
        assert r["reduce_scatters"] == n + 1
        assert r["root_sharded_between"] is False


def test_resharding_the_root_costs_one_more_all_gather_and_computes_the_same(measured):
    for kept, resharded in zip(measured[None], measured[True], strict=True):
        assert resharded["all_gathers"] == kept["all_gathers"] + 1  # 10 for 4 layers + root
        assert resharded["reduce_scatters"] == kept["reduce_scatters"]
        assert resharded["root_sharded_between"] is True
        assert resharded["loss"] == pytest.approx(kept["loss"], rel=0, abs=0)


def test_the_communication_model_counts_the_same(measured):
    config = resolve_model_config("tiny")
    for flag, runs in measured.items():
        coll = estimate_collectives(
            config, n_gpus=2, fsdp_version=2, mixed_precision="no", root_reshard_after_forward=bool(flag)
        )
        gathers = coll.loc[coll["kind"].eq("all-gather"), "count"].sum()
        assert gathers == runs[0]["all_gathers"], flag


def test_torch_default_for_the_root_is_no_reshard():
    """What the default follows: ``fully_shard``'s None keeps the root gathered (torch's own heuristic)."""
    import inspect

    from torch.distributed.fsdp import fully_shard

    doc = inspect.getdoc(fully_shard)
    assert "set ``False`` for the root module" in doc
    assert torch.__version__.startswith("2.13")
