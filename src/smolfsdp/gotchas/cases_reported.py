"""Problems users reported upstream, reproduced on 2 gloo ranks (one ``torchrun`` launch with the other
distributed gotchas), each failing form beside its fix.

Chapter "Debugging the seams" (``notebooks/06_gotchas.ipynb``) through ``smolfsdp.gotchas.run_all``; each case
registers itself in ``smolfsdp.gotchas.registry.GOTCHAS`` (titles, explanations and the public threads are there).
The cases that make one rank skip or outwait a collective are in ``smolfsdp.gotchas.cases_collectives``.

    smolfsdp gotchas --run forward_before_optimizer,clip_grad_norm_fsdp1,bf16_weights_lose_updates
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as torch_apply_activation_checkpointing,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import DTensor

from smolfsdp.gotchas.builders import decoder_layer_cls, full_tensor, rank_batch, shard_fsdp2, tiny_model
from smolfsdp.gotchas.registry import WRONG, attempt, gotcha
from smolfsdp.installed_source import installed_line
from smolfsdp.sharding.fsdp1 import fsdp_units, wrap_fsdp1
from smolfsdp.sharding.shards import apply_activation_checkpointing

STEPS = 3  # optimizer steps of the forward-before-optimizer case: enough for the loss to fall
MAX_NORM = 1.0  # the clipping threshold (the package's max_grad_norm default)
SMALL_LR = 1e-5  # a fine-tuning learning rate: AdamW's first step moves each weight by about this much


def _per_rank(value: Any, world: int) -> dict[str, Any]:
    """``value`` from every rank, by rank (a collective on the default group): what rank 0 writes."""
    got: list[Any] = [None] * world
    dist.all_gather_object(got, value)
    return {f"rank{r}": v for r, v in enumerate(got)}


# --------------------------------------------------------------- parameters that silently never train
@gotcha("forward_before_optimizer")
def forward_before_optimizer(rank: int, world: int) -> dict[str, Any]:

    def train(first: str) -> dict[str, Any]:
        model = shard_fsdp2(tiny_model()[0], world)
        if first != "optimizer":  # a forward before the optimizer: a sanity check, an eval on start
            model(**rank_batch(rank))
            if first == "forward_then_reshard":
                model.reshard()
        plain = sorted(n for n, p in model.named_parameters() if not isinstance(p, DTensor))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        start = {n: full_tensor(p).clone() for n, p in model.named_parameters()}
        losses = []
        for _ in range(STEPS):
            loss = model(**rank_batch(rank)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(round(float(loss.detach()), 4))
        unchanged = [n for n, p in model.named_parameters() if torch.equal(full_tensor(p), start[n])]
        return {"optimizer_got_plain_tensors": plain or "none", "losses": losses,
                "parameters_unchanged": unchanged or "none"}  # fmt: skip

    failing = attempt(train, "forward")
    if failing["outcome"] == "ok" and failing["parameters_unchanged"] != "none":
        names = ", ".join(failing["parameters_unchanged"])
        failing.update(outcome=WRONG, symptom=f"the loss fell and {names} never changed")
    failing["where"] = [
        installed_line("torch/distributed/fsdp/_fully_shard/_fsdp_state.py", "For the root, do not reshard"),
        installed_line("torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "self._setattr_on_modules(self._unsharded_param)"),
    ]  # fmt: skip
    fixed = attempt(train, "optimizer")
    fixed["reshard_before_optimizer"] = attempt(train, "forward_then_reshard")
    return {"failing": failing, "fixed": fixed}


# --------------------------------------------------------------- QLoRA's integer storage, CPU stand-in
class Packed4bitLinear(nn.Module):
    """A CPU stand-in for bitsandbytes' ``Linear4bit``: the weight quantised to 4 bits (absmax per output row,
    16 levels), two values packed per byte (``[out, in / 2]`` bytes), kept in a frozen Parameter whose dtype is
    ``storage`` (uint8, bitsandbytes' default ``bnb_4bit_quant_storage``, or bf16 viewing the same bytes);
    dequantised in forward. Raises RuntimeError for an odd ``in_features``."""

    def __init__(self, linear: nn.Linear, storage: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-8) / 7
        q = (torch.round(w / scale).clamp(-8, 7) + 8).to(torch.uint8)  # 0..15
        packed = q[:, 0::2] | (q[:, 1::2] << 4)
        self.weight = nn.Parameter(packed.view(storage), requires_grad=False)
        self.register_buffer("scale", scale.to(linear.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.weight.view(torch.uint8)
        q = torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2).to(self.scale.dtype) - 8
        return F.linear(x, (q * self.scale).to(x.dtype))


def quantised_tiny_model(storage: torch.dtype) -> nn.Module:
    """The tiny SmolLM3 in bf16 with every decoder-layer Linear replaced by :class:`Packed4bitLinear`
    (QLoRA quantises those, not the embedding or the head)."""
    model = tiny_model(dtype=torch.bfloat16)[0]
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Packed4bitLinear(child, storage))
    return model


@gotcha("qlora_integer_storage")
def qlora_integer_storage(rank: int, world: int) -> dict[str, Any]:
    batch = rank_batch(rank)
    reference = quantised_tiny_model(torch.uint8)  # unsharded: the logits and bytes to match
    ref_logits = reference(**batch).logits
    ref_bytes = reference.model.layers[0].self_attn.q_proj.weight

    def fsdp1(storage: torch.dtype) -> dict[str, Any]:
        model = wrap_fsdp1(quantised_tiny_model(storage), decoder_layer_cls())
        diff = float((model(**batch).logits - ref_logits).abs().max())
        with FSDP.summon_full_params(model):
            packed = model.module.model.layers[0].self_attn.q_proj.weight.view(torch.uint8)
            same = torch.equal(packed, ref_bytes)
        return {"fsdp_units": len(fsdp_units(model)), "packed_bytes_identical": same, "max_abs_diff": diff}

    def fsdp2_uint8() -> dict[str, Any]:
        model = shard_fsdp2(quantised_tiny_model(torch.uint8), world)
        return {"max_abs_diff": float((model(**batch).logits - ref_logits).abs().max())}

    failing = {"storage_dtype": "uint8", **attempt(fsdp1, torch.uint8)}
    fixed = {"storage_dtype": "bfloat16", **attempt(fsdp1, torch.bfloat16)}
    fixed["fsdp2_uint8_storage"] = attempt(fsdp2_uint8)
    return {"failing": failing, "fixed": fixed}


# --------------------------------------------------------------- activation checkpointing with the KV cache on
def padded_batch(rank: int) -> dict[str, torch.Tensor]:
    """:func:`rank_batch` with the second row's last 6 tokens padding (attention mask 0, labels -100)."""
    batch = rank_batch(rank)
    mask = torch.ones_like(batch["input_ids"])
    mask[1, -6:] = 0
    batch["labels"] = batch["labels"].masked_fill(mask == 0, -100)
    return {**batch, "attention_mask": mask}


@gotcha("kv_cache_checkpointing")
def kv_cache_checkpointing(rank: int, world: int) -> dict[str, Any]:
    batch = padded_batch(rank)

    def step(recompute: str) -> dict[str, Any]:
        model = tiny_model()[0]  # SmolLM3's config keeps use_cache=True
        if (
            recompute == "torch"
        ):  # what a hand-written loop (or accelerate's FSDP activation checkpointing) does
            wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
            check = lambda m: isinstance(m, decoder_layer_cls())  # noqa: E731
            torch_apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=check)
        elif recompute == "smolfsdp":
            apply_activation_checkpointing(model, decoder_layer_cls())
        use_cache = model.config.use_cache
        model = shard_fsdp2(model, world)
        loss = model(**batch).loss
        loss.backward()
        return {"use_cache": use_cache, "loss": round(float(loss.detach()), 6)}

    failing = attempt(step, "torch")
    fixed = attempt(step, "smolfsdp")
    fixed["without_checkpointing"] = attempt(step, "none")  # the loss the recomputed step must give
    return {"failing": failing, "fixed": fixed}


# --------------------------------------------------------------- clip_grad_norm_ on FSDP1
@gotcha("clip_grad_norm_fsdp1")
def clip_grad_norm_fsdp1(rank: int, world: int) -> dict[str, Any]:

    def clip(fsdp_method: bool) -> dict[str, Any]:
        model = wrap_fsdp1(tiny_model()[0], decoder_layer_cls())
        model(**rank_batch(rank)).loss.backward()
        if fsdp_method:
            norm = model.clip_grad_norm_(MAX_NORM)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        # every rank holds a shard of the (averaged) gradient: the whole gradient's norm after clipping
        local = sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total)
        return {"norm_returned": _per_rank(round(float(norm), 4), world), "max_norm": MAX_NORM,
                "global_norm_after_clipping": round(math.sqrt(float(total)), 4)}  # fmt: skip

    failing = attempt(clip, False)
    if failing["outcome"] == "ok" and len(set(failing["norm_returned"].values())) > 1:
        failing.update(outcome=WRONG, symptom="each rank clipped its shard by its own norm")
    return {"failing": failing, "fixed": attempt(clip, True)}


# --------------------------------------------------------------- bf16 weights lose small updates
@gotcha("bf16_weights_lose_updates")
def bf16_weights_lose_updates(rank: int, world: int) -> dict[str, Any]:

    def one_step(bf16_weights: bool) -> dict[str, Any]:
        if bf16_weights:  # the model loaded in bf16 (torch_dtype=torch.bfloat16), no mixed precision
            model = wrap_fsdp1(tiny_model(dtype=torch.bfloat16)[0], decoder_layer_cls())
        else:  # fp32 sharded weights, bf16 compute
            model = wrap_fsdp1(tiny_model()[0], decoder_layer_cls(), param_dtype=torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=SMALL_LR)
        before = [p.detach().clone() for p in model.parameters()]
        model(**rank_batch(rank)).loss.backward()
        opt.step()
        counts = torch.tensor(
            [sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before, strict=True)),
             sum(b.numel() for b in before)], dtype=torch.float64,
        )  # fmt: skip
        dist.all_reduce(counts)  # each rank counted its shards
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        return {"sharded_weights_dtype": dtype, "learning_rate": SMALL_LR,
                "weights_changed": round(float(counts[0] / counts[1]), 4), "weights": int(counts[1])}  # fmt: skip

    failing = attempt(one_step, True)
    if failing["outcome"] == "ok" and failing["weights_changed"] < 0.5:
        share = f"{failing['weights_changed']:.1%}"
        failing.update(outcome=WRONG, symptom=f"one AdamW step changed only {share} of the weights")
    return {"failing": failing, "fixed": attempt(one_step, False)}
