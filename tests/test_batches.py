"""The native engine's batches (``smolfsdp.train.batches``): step counts and a resumable data order.

No process group: ``DistributedSampler`` takes the rank and world size as arguments.
"""

from __future__ import annotations

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from smolfsdp.config import TrainConfig
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.train.batches import BatchStream, build_loader, count_label_tokens, count_steps

RANK0_OF_2 = DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")


def _rows(n: int) -> list[dict[str, list[int]]]:
    """``n`` rows of different lengths; row i starts with token i so a batch says which rows it holds."""
    return [{"input_ids": [i] + [7] * (i % 3), "labels": [i] + [7] * (i % 3)} for i in range(n)]


def test_count_steps_epochs_max_steps_and_too_few_rows():
    cfg = TrainConfig(gradient_accumulation_steps=2, num_train_epochs=1.5)
    assert count_steps(9, 72, cfg, RANK0_OF_2) == (4, 6)  # 9 micro-batches // 2; ceil(1.5 * 4)
    assert count_steps(9, 72, TrainConfig(gradient_accumulation_steps=2, max_steps=5), RANK0_OF_2) == (4, 5)
    with pytest.raises(ValueError, match="3 training rows make no full step of 4 x 2 ranks x 2"):
        count_steps(1, 3, cfg, RANK0_OF_2)


def test_stream_resumed_at_a_position_continues_the_same_order():
    cfg = TrainConfig(per_device_train_batch_size=2, seed=3)
    rows = _rows(10)  # rank 0 of 2: 5 rows, 2 micro-batches of 2 per epoch (the last row dropped)

    def stream(**position):
        return BatchStream(
            *build_loader(rows, DataCollatorForLanguageModeling(pad_token_id=0), cfg, RANK0_OF_2), **position
        )

    first = stream()
    seen = [next(first)["input_ids"][:, 0].tolist() for _ in range(5)]  # crosses two epoch ends
    assert first.position() == {"epoch": 2, "consumed": 1}
    at_3 = stream(epoch=1, consumed=1)  # where a checkpoint after 3 micro-batches stands
    assert [next(at_3)["input_ids"][:, 0].tolist() for _ in range(2)] == seen[3:5]


def test_pad_collator_masks_padding_out_of_the_loss():
    batch = DataCollatorForLanguageModeling(pad_token_id=0)(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [5], "labels": [5]}]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [5, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert count_label_tokens(batch) == 2  # after the causal shift: 6 and 7 of row 0; row 1 has none
