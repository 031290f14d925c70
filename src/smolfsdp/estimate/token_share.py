"""How many of the tokens a step computes are real: padded micro-batches against TRL's BFD packing.

Chapter "The full fine-tune" (``notebooks/01_finetune.ipynb``, section "How fast it runs") and
``scripts/token_efficiency.py`` use it. Pure functions of a list of row lengths (tokens per tokenised row, as
``smolfsdp.data.prepare`` makes them); nothing is timed and no model is built.

* **Padded** (what TRL's ``DataCollatorForLanguageModeling`` and ``smolfsdp.train.batches`` do): rows are
  shuffled, taken ``micro_batch`` at a time, and each micro-batch is right-padded to its longest row, so it
  computes ``micro_batch x max(lengths in it)`` tokens. ``share = sum(lengths) / sum over micro-batches of
  (rows in it x its longest row)``.
* **Packed** (``trl.data_utils.pack_dataset(..., strategy="bfd")``, what ``SFTConfig(packing=True)`` runs):
  best-fit decreasing puts whole rows into rows of ``max_length`` tokens (a row longer than that is cut to it);
  ``share = real tokens / (packed rows x max_length)``, the fill of the ``max_length`` budget each packed row
  is given. With TRL's padding-free collator nothing is padded at all; this share is then how much of the
  sequence length a step is sized for holds tokens.

    python -c "from smolfsdp.estimate.token_share import padded_share as p; print(p([5, 3, 2, 8], 2, seed=0))"
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from smolfsdp.errors import ConfigError


def _lengths(lengths: Sequence[int]) -> list[int]:
    """``lengths`` as a list of positive ints; ConfigError naming the first bad one."""
    out = list(lengths)
    if not out:
        raise ConfigError("token share of no rows: give the token length of at least one row.")
    for i, n in enumerate(out):
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ConfigError(
                f"row {i} has length {n!r}: row lengths are whole numbers of tokens, at least 1."
            )
    return [int(n) for n in out]


def _whole(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ConfigError(f"{name}={value!r}: give a whole number of at least 1.")
    return int(value)


def padded_batches(lengths: Sequence[int], micro_batch: int, seed: int = 0) -> list[list[int]]:
    """The micro-batches of the padded path: the rows' lengths shuffled by ``random.Random(seed)`` (a stand-in
    for the sampler's seeded order) and cut into groups of ``micro_batch``; the last group keeps what is left
    (the Trainer's default ``dataloader_drop_last=False``). ConfigError for bad lengths or ``micro_batch``."""
    rows, k = _lengths(lengths), _whole("micro_batch", micro_batch)
    random.Random(seed).shuffle(rows)
    return [rows[i : i + k] for i in range(0, len(rows), k)]


def padded_tokens(lengths: Sequence[int], micro_batch: int, seed: int = 0) -> int:
    """Tokens the padded path computes: ``sum over micro-batches of len(batch) x max(batch)``
    (:func:`padded_batches`), padding included."""
    return sum(len(b) * max(b) for b in padded_batches(lengths, micro_batch, seed))


def padded_share(lengths: Sequence[int], micro_batch: int, seed: int = 0) -> float:
    """Share of computed tokens that are real when each micro-batch of ``micro_batch`` shuffled rows is padded
    to its longest row: ``sum(lengths) / padded_tokens(lengths, micro_batch, seed)``, in (0, 1]; 1.0 for
    ``micro_batch=1`` (a row alone is never padded)."""
    return sum(_lengths(lengths)) / padded_tokens(lengths, micro_batch, seed)


def pack_lengths(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """The packed rows TRL's best-fit-decreasing packing makes of rows of these lengths: one list of row
    lengths (``seq_lengths``, TRL's column) per packed row, each summing to at most ``max_length``.

    Runs ``trl.data_utils.pack_dataset(dataset, max_length, strategy="bfd")`` itself on a ``datasets.Dataset``
    whose ``input_ids`` column holds rows of these lengths (zeros; packing reads only lengths), so TRL's own
    rules hold: rows longer than ``max_length`` are cut to it, and ``Dataset.map`` packs in batches of 1,000
    rows, each batch into its own packed rows (as ``SFTTrainer`` packs). ConfigError for bad input."""
    import numpy as np  # deferred with the rest: only packing needs arrow, datasets and TRL
    import pyarrow as pa  # deferred: arrow, for the rows' offsets
    from datasets import Dataset  # deferred: datasets (pyarrow) is heavy
    from datasets.utils import logging as ds_logging  # deferred with datasets
    from trl.data_utils import pack_dataset  # deferred: importing TRL imports transformers (seconds)

    rows, n = _lengths(lengths), _whole("max_length", max_length)
    offsets = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
    ids = pa.LargeListArray.from_arrays(offsets, np.zeros(int(offsets[-1]), dtype=np.int32))
    bars = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()  # a "Map" bar per call would bury what the caller prints
    try:
        packed = pack_dataset(Dataset(pa.table({"input_ids": ids})), n, strategy="bfd")
    finally:
        if bars:
            ds_logging.enable_progress_bar()
    return packed.data.column("seq_lengths").to_pylist()


def packed_rows(lengths: Sequence[int], max_length: int) -> int:
    """How many rows of ``max_length`` tokens TRL's BFD packing makes of these rows (:func:`pack_lengths`)."""
    return len(pack_lengths(lengths, max_length))


def packed_share(lengths: Sequence[int], max_length: int) -> float:
    """Share of the packed rows' ``max_length`` budget that real tokens fill under TRL's BFD packing:
    ``sum(min(length, max_length)) / (packed rows x max_length)`` (:func:`pack_lengths`), in (0, 1]."""
    bins = pack_lengths(lengths, max_length)
    return sum(map(sum, bins)) / (len(bins) * max_length)


def steps_per_epoch(rows: int, *, n_gpus: int, micro_batch: int, gradient_accumulation_steps: int) -> int:
    """Optimizer steps one epoch of ``rows`` training rows (or packed rows) takes: ``ceil(rows / (n_gpus x
    micro_batch x gradient_accumulation_steps))``, the rule of ``smolfsdp.book.full_budget.optimizer_steps``."""
    per_step = (
        _whole("n_gpus", n_gpus)
        * _whole("micro_batch", micro_batch)
        * _whole("gradient_accumulation_steps", gradient_accumulation_steps)
    )
    return math.ceil(_whole("rows", rows) / per_step)
