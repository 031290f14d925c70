"""Batches for the native engine: padding, the per-rank data order, and how many steps a run makes.

Padding is TRL's: ``trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id=...)``, the collator
``SFTTrainer`` builds for itself, right-pads ``input_ids`` with the pad id and ``labels`` with -100 and builds
the attention mask (1 on tokens, 0 on padding), so both engines pad alike. ``build_loader`` gives each rank
its share of the training split (``DistributedSampler``, shuffled by the run's seed, incomplete batches dropped);
``BatchStream`` hands out micro-batches across epochs and replays the order to resume a checkpoint;
``count_steps`` turns epochs or ``max_steps`` into optimizer steps. Used by
``smolfsdp.train.native`` and by the tests and chapters that run one step by hand.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, DistributedSampler

from smolfsdp.config import TrainConfig
from smolfsdp.data.chat import IGNORE_INDEX
from smolfsdp.sharding.distributed import DistInfo


def count_label_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that carry a loss after the causal shift (what HF's ForCausalLMLoss averages over)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def build_loader(
    train_ds, collator, cfg: TrainConfig, info: DistInfo
) -> tuple[DataLoader, DistributedSampler]:
    """This rank's ``DataLoader`` over ``train_ds``: ``per_device_train_batch_size`` rows per
    micro-batch, shuffled by ``cfg.seed`` through a ``DistributedSampler``, incomplete batches dropped."""
    sampler = DistributedSampler(
        train_ds, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    loader = DataLoader(
        train_ds,
        batch_size=cfg.per_device_train_batch_size,
        sampler=sampler,
        collate_fn=collator,
        drop_last=True,
    )
    return loader, sampler


def count_steps(n_batches: int, n_rows: int, cfg: TrainConfig, info: DistInfo) -> tuple[int, int]:
    """``(steps per epoch, total optimizer steps)`` for ``n_batches`` micro-batches per rank and epoch.

    ``max_steps > 0`` wins over ``num_train_epochs``. Raises ValueError when the ``n_rows`` training
    rows make no full step and no ``max_steps`` is set.
    """
    steps_per_epoch = n_batches // cfg.gradient_accumulation_steps
    if steps_per_epoch == 0 and cfg.max_steps <= 0:
        raise ValueError(
            f"{n_rows} training rows make no full step of "
            f"{cfg.per_device_train_batch_size} x {info.world_size} ranks x "
            f"{cfg.gradient_accumulation_steps}; lower the batch size or add rows."
        )
    total_steps = cfg.max_steps if cfg.max_steps > 0 else math.ceil(cfg.num_train_epochs * steps_per_epoch)
    return steps_per_epoch, total_steps


class BatchStream:
    """Micro-batches in a fixed order (sampler seed + epoch), resumable at any position."""

    def __init__(self, loader: DataLoader, sampler: DistributedSampler, epoch: int = 0, consumed: int = 0):
        self.loader, self.sampler = loader, sampler
        self.epoch, self.consumed = epoch, 0
        self._start(epoch)
        for _ in range(consumed):  # replay the data order up to where a checkpoint stopped
            next(self)

    def _start(self, epoch: int) -> None:
        self.epoch, self.consumed = epoch, 0
        self.sampler.set_epoch(epoch)
        self._it = iter(self.loader)

    def __next__(self) -> dict[str, torch.Tensor]:
        try:
            batch = next(self._it)
        except StopIteration:
            self._start(self.epoch + 1)
            batch = next(self._it)
        self.consumed += 1
        return batch

    def position(self) -> dict[str, int]:
        """Where the stream stands, as a checkpoint records it (``BatchStream(..., **position)`` resumes)."""
        return {"epoch": self.epoch, "consumed": self.consumed}
