"""One step on 2 FSDP ranks gives the gradients of one process on the full batch (fp32)."""

import pytest
import torch
from _dist import run_distributed

from smolfsdp.config import TrainConfig
from smolfsdp.data import prepare_data
from smolfsdp.modeling import build_model, load_tokenizer, resolve_wrap_class
from smolfsdp.native import PadCollator, forward_backward

N_ROWS = 4


def _rows(tok):
    # uneven lengths on purpose: each rank pads differently and holds a different number of label tokens
    data = prepare_data(TrainConfig(eval_size=0, max_rows=N_ROWS, max_length=96), tok)
    return [data.train[i] for i in range(N_ROWS)]


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _sharded_grads(rank, world, version):
    import torch.distributed as dist

    from smolfsdp.distributed import DistInfo

    tok = load_tokenizer("tiny")
    rows = _rows(tok)
    model = build_model("tiny", tok, seed=0)
    wrap = resolve_wrap_class(model)
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from smolfsdp.fsdp1 import wrap_fsdp1

        model = wrap_fsdp1(model, wrap, device=info.device)
    else:
        from torch.distributed.device_mesh import init_device_mesh

        from smolfsdp.fsdp2 import apply_fsdp2

        apply_fsdp2(model, init_device_mesh("cpu", (world,)), wrap)
    per_rank = N_ROWS // world
    local = rows[rank * per_rank : (rank + 1) * per_rank]
    loss, n_items = forward_backward(model, [PadCollator(tok.pad_token_id)(local)], world, info.device)
    grads = {}
    if version == 1:
        with FSDP.summon_full_params(model, with_grads=True):
            for n, p in model.named_parameters():
                grads[_clean(n)] = p.grad.detach().clone()
    else:
        for n, p in model.named_parameters():
            grads[n] = p.grad.full_tensor().detach().clone()
    dist.barrier()
    return {"loss": loss, "n_items": n_items, "grads": grads}


@pytest.fixture(scope="module")
def reference():
    tok = load_tokenizer("tiny")
    rows = _rows(tok)
    model = build_model("tiny", tok, seed=0)
    out = model(**PadCollator(tok.pad_token_id)(rows))
    out.loss.backward()
    return {"loss": out.loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


@pytest.mark.parametrize("version", [1, 2])
def test_two_rank_gradients_equal_single_process(version, reference):
    results = run_distributed(_sharded_grads, 2, version)
    r0 = results[0]
    assert r0["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert set(r0["grads"]) == set(reference["grads"])
    for name, ref in reference["grads"].items():
        got = r0["grads"][name]
        assert got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert results[1]["loss"] == pytest.approx(r0["loss"])  # every rank reports the global loss
