"""The arithmetic of one native training step: forward/backward over micro-batches, clipping, evaluation.

Each step all-reduces the number of label tokens so the loss is the mean over the global batch
(gradients then equal a single-process run on the full batch, as ``tests/test_gradients.py`` checks);
evaluation runs on every rank in lock-step so FSDP's collectives match. ``smolfsdp.train.native``
calls these in its ``train_step``; tests and chapters call them to run one step by hand.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from smolfsdp.data.chat import IGNORE_INDEX
from smolfsdp.data.packing import check_rows_apart
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.train.batches import count_label_tokens

#: the batch keys a causal LM's forward takes (a collator may add others, e.g. TRL's ``completion_mask``)
MODEL_INPUTS = ("input_ids", "attention_mask", "labels", "position_ids")


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch on ``device``; non-tensor entries (the padding-free collator's ``max_length_q``) as they are."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


#: Every training and eval forward runs without a KV cache. SmolLM3's config keeps ``use_cache=True``; with a
#: cache, transformers' ``create_causal_mask`` skips its packed-sequence check, so the rows of a padding-free
#: batch would attend to each other (``smolfsdp.data.packing``). TRL's ``compute_loss`` passes the same.
NO_CACHE = {"use_cache": False}


def forward_backward(
    model: nn.Module,
    micro_batches: list[dict[str, torch.Tensor]],
    world_size: int,
    device: torch.device,
    reduce_loss: bool = True,
) -> tuple[float, int]:
    """Forward and backward over this rank's micro-batches of one optimizer step.

    The loss of each micro-batch is its summed token loss divided by the label tokens of the whole
    global batch (all ranks, all micro-batches; one all-reduce), times ``world_size`` because FSDP
    averages gradients over ranks. The gradient is then exactly that of the mean token loss over the
    global batch, as in a single-process run. Returns ``(global mean loss, global label tokens)``;
    with ``reduce_loss=False`` the loss is this rank's share (sum it over ranks to get the mean),
    so the training loop can fold that all-reduce into its per-step one.
    """
    for batch in micro_batches:
        check_rows_apart(batch)  # a packed row with an attention mask would attend across its rows
    local_items = torch.tensor([sum(count_label_tokens(b) for b in micro_batches)], device=device)
    dist.all_reduce(local_items)
    n_items = int(local_items.item())
    total = torch.zeros((), device=device)
    for batch in micro_batches:
        total += micro_batch_backward(model, batch, world_size, device, n_items)
    if reduce_loss:
        dist.all_reduce(total)
    return float(total.item()), n_items


def micro_batch_backward(
    model: nn.Module,
    batch: dict[str, torch.Tensor],
    world_size: int,
    device: torch.device,
    n_items: int,
    **forward_kwargs,
) -> torch.Tensor:
    """Forward and backward of one micro-batch whose loss is scaled to the global batch of ``n_items``
    label tokens (see :func:`forward_backward`); returns the detached fp32 loss (a 0-d tensor, no sync).
    The full-size dry run (``smolfsdp.audit.dryrun``) calls this on fake tensors, for a TRL-engine recipe with
    ``fused_lm_head=True`` (``forward_kwargs`` go to the model's forward)."""
    kwargs = {**NO_CACHE, **forward_kwargs}
    out = model(**_to(batch, device), num_items_in_batch=max(n_items, 1), **kwargs)
    (out.loss * world_size).backward()
    return out.loss.detach().float()


def clip_grad_norm(model: nn.Module, max_norm: float, fsdp_version: int) -> float:
    """Clip the global gradient norm to ``max_norm`` and return the norm before clipping.

    FSDP1 needs its own ``clip_grad_norm_`` (each rank holds a shard of every FlatParameter's
    gradient); under FSDP2 torch's ``clip_grad_norm_`` works on the DTensor gradients and returns
    the norm as a DTensor, which ``full_tensor()`` turns into one number. With FSDP1 + LoRA a rank whose
    shards hold no adapter element has no local gradient: torch warns, yet returns the same global norm
    (``smolfsdp.quiet`` filters that one warning and says why).
    """
    return float(clip_grad_norm_tensor(model, max_norm, fsdp_version))


def clip_grad_norm_tensor(model: nn.Module, max_norm: float, fsdp_version: int) -> torch.Tensor:
    """:func:`clip_grad_norm` without reading the norm back to the host (a 0-d tensor)."""
    if fsdp_version == 1:
        return model.clip_grad_norm_(max_norm)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def is_eval_step(step: int, total_steps: int, eval_steps: int) -> bool:
    """Whether the run evaluates after optimizer step ``step`` of ``total_steps``: every ``eval_steps`` steps
    (0: never in between) and after the last step. Before the first step (step 0, or the step a resumed run
    starts from) it evaluates when ``eval_on_start`` is set. One schedule for every engine: the native loop
    calls this; the TRL engine gets the same from ``eval_on_start``, ``eval_strategy="steps"`` (the Trainer
    also evaluates at its last step) and ``trl_callbacks.EvalAtEndCallback`` for ``eval_steps`` 0."""
    return step == total_steps or (eval_steps > 0 and step % eval_steps == 0)


def eval_metrics(evals: list[tuple[int, float]]) -> dict[str, float | int | None]:
    """The summary's eval fields from the run's ``(step, eval loss)`` pairs in order: the first and last loss
    and the steps they were taken at (all None without any evaluation). The headline quotes them."""
    (s0, l0), (s1, l1) = (evals[0], evals[-1]) if evals else ((None, None), (None, None))
    return {"eval_loss_first": l0, "eval_loss_last": l1, "eval_step_first": s0, "eval_step_last": s1}


@torch.no_grad()
def evaluate(model: nn.Module, eval_ds, collator, batch_size: int, info: DistInfo) -> float:
    """Mean token loss over the whole eval split: summed token loss over every label token of every row, each
    row once, divided by the number of label tokens (what one process evaluating all rows gives). Rows are
    split over ranks; ranks with fewer rows run fully-masked batches so every rank makes the same number of
    FSDP forward calls. Both engines call this (the TRL engine from ``SmolSFTTrainer.evaluate``, with the
    Trainer's collator: the padding row's labels are masked after collating, whatever keys it builds)."""
    model.eval()
    idx = list(range(info.rank, len(eval_ds), info.world_size))
    n_batches = math.ceil(math.ceil(len(eval_ds) / info.world_size) / batch_size)
    sums = torch.zeros(2, device=info.device, dtype=torch.float64)
    for b in range(n_batches):
        rows = [eval_ds[i] for i in idx[b * batch_size : (b + 1) * batch_size]]
        batch = dict(collator(rows or [eval_ds[0]]))
        if not rows:  # keep collectives in step: one row, no labels
            batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
        batch = {k: v for k, v in batch.items() if k in MODEL_INPUTS}
        n = count_label_tokens(batch)
        out = model(**_to(batch, info.device), num_items_in_batch=1, **NO_CACHE)  # loss = summed token loss
        sums += torch.tensor(
            [out.loss.double().item() if n else 0.0, n], device=info.device, dtype=torch.float64
        )
    dist.all_reduce(sums)
    # FSDP2 keeps the root gathered after forward (``apply_fsdp2``: backward needs it at once); evaluation
    # has no backward to reshard it, so free the gathered root here (a no-op for sharded groups and FSDP1)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    model.train()
    return float(sums[0] / sums[1])
