"""Defects of the native / GPU-facing path, each pinned by a test that failed before its fix (issue 11):
process-group backend with offload, FSDP1 offload refused on CPU before launch, FSDP2 sharding without
moving the whole model first, generate() on sharded LoRA models."""

import pytest
import torch

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.sharding.distributed import check_offload_support, choose_backend


def test_backend_pairs_gloo_with_nccl_when_offloading():
    assert choose_backend("cpu") == "gloo"
    assert choose_backend("cpu", cpu_offload=True) == "gloo"
    assert choose_backend("cuda") == "nccl"
    # offloaded shards are CPU tensors: clipping all-reduces them, which NCCL cannot do
    assert choose_backend("cuda", cpu_offload=True) == "cuda:nccl,cpu:gloo"
    assert torch.distributed.Backend("cuda:nccl,cpu:gloo") == "cuda:nccl,cpu:gloo"  # torch parses the pair
    with pytest.raises(ConfigError, match="'mps'"):
        choose_backend("mps")


def test_fsdp1_offload_without_cuda_is_refused_before_launch(monkeypatch):
    from smolfsdp.launch import runner

    check_offload_support(1, True, cuda_available=True)  # a GPU machine: fine
    check_offload_support(2, True, cuda_available=False)  # FSDP2's CPUOffloadPolicy runs on CPU
    check_offload_support(1, False, cuda_available=False)
    with pytest.raises(ConfigError, match="cpu_offload with fsdp_version 1 needs a GPU.*fsdp_version: 2"):
        check_offload_support(1, True, cuda_available=False)

    def no_launch(*a, **k):
        raise AssertionError("launched")

    monkeypatch.setattr("smolfsdp.launch.torchrun.launch", no_launch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = TrainConfig(name="fsdp1-offload-cpu", cpu_offload=True, fsdp_version=1, max_steps=1)
    with pytest.raises(ConfigError, match="Cannot access accelerator device"):
        runner.preflight(cfg)
    with pytest.raises(ConfigError, match="needs a GPU"):
        runner.run(cfg)


def _shard_with_offload(rank, world, offload):
    """The native FSDP2 sharding with a spy on the whole model's ``.to``; one forward/backward after."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import DTensor
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.models.modeling import build_model, load_tokenizer
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.train.native import shard_model
    from smolfsdp.train.steps import forward_backward

    tok = load_tokenizer("tiny")
    model = build_model("tiny", tok, seed=0)
    moved = []
    whole_to = model.to
    model.to = lambda *a, **k: moved.append((a, k)) or whole_to(*a, **k)  # instance attribute shadows it
    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    cfg = TrainConfig(fsdp_version=2, cpu_offload=offload, nproc=world)
    model, _ = shard_model(model, cfg, info)
    params = list(model.parameters())
    policies = {type(p).__name__ for g in _groups(model) for p in [g._fsdp_param_group.offload_policy]}
    ids = torch.arange(3, 40).reshape(1, -1) + rank
    loss, _ = forward_backward(
        model,
        [
            DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
                [{"input_ids": ids[0].tolist(), "labels": ids[0].tolist()}]
            )
        ],
        world,
        info.device,
    )
    return {
        "whole_model_moves": len(moved),
        "all_dtensor": all(isinstance(p, DTensor) for p in params),
        "local_devices": sorted({p.to_local().device.type for p in params}),
        "grad_devices": sorted({p.grad.to_local().device.type for p in params if p.grad is not None}),
        "policies": sorted(policies),
        "cpu_offload_policy": CPUOffloadPolicy.__name__,
        "loss": loss,
    }


def _groups(model):
    from smolfsdp.sharding.fsdp2 import fsdp_units

    return [m._get_fsdp_state() for m in fsdp_units(model)]


def test_fsdp2_shards_without_moving_the_whole_model_first():
    """``native.shard_model`` used to call ``model.to(device)`` before ``fully_shard``: the whole model on
    the device at once, whatever the offload. Now each group moves itself; with offload the shards and
    their gradients stay on the host, and the loss is the one without offload."""
    from _dist import run_distributed

    off, on_device = (run_distributed(_shard_with_offload, 2, flag)[0] for flag in (True, False))
    for r in (off, on_device):
        assert r["whole_model_moves"] == 0 and r["all_dtensor"]
        assert r["local_devices"] == ["cpu"] and r["grad_devices"] == ["cpu"]
    assert off["policies"] == ["CPUOffloadPolicy"] and on_device["policies"] == ["OffloadPolicy"]
    assert off["loss"] == pytest.approx(on_device["loss"], rel=1e-6)
