"""Packing and padding-free batches: TRL's best-fit-decreasing packing, TRL's padding-free collator, and the
count of real tokens against tokens computed.

Used by both engines (``smolfsdp.data.prepare`` packs where the package tokenises; ``smolfsdp.train.native``
and ``smolfsdp.train.trl_engine`` collate) and by the fine-tune chapter. The run config's ``packing`` and
``padding_free`` (TRL's ``SFTConfig`` names) choose:

* **padded** (both false): TRL's ``DataCollatorForLanguageModeling`` right-pads each micro-batch to its longest
  row and sends an ``attention_mask``; the padding is computed and thrown away.
* **padding-free** (``padding_free: true``): the same collator with ``padding_free=True`` concatenates the
  micro-batch's rows into one row of ``sum(lengths)`` tokens, no padding, no ``attention_mask``, ``position_ids``
  that restart at 0 at each row, and the label at each row start set to -100.
* **packed** (``packing: true``, padding-free implied, as TRL's ``SFTTrainer`` implies it for ``bfd``): before
  training, ``trl.data_utils.pack_dataset(..., strategy="bfd")`` packs the tokenised rows into rows of at most
  ``max_length`` tokens (best fit decreasing; every row is already at most ``max_length``, so nothing is cut) with
  a ``seq_lengths`` column; the padding-free collator then flattens ``per_device_train_batch_size`` packed rows
  into one row of at most ``per_device_train_batch_size x max_length`` tokens, ``position_ids`` restarting per
  original row. Steps per epoch follow the packed row count.

Rows stay apart: with ``position_ids`` and no ``attention_mask`` and no KV cache, transformers' ``create_causal_mask``
(``masking_utils.find_packed_sequence_indices``) gives SDPA and eager a block-diagonal causal mask, and flash
attention takes the ``cu_seq_lens`` / ``position_ids`` varlen path. A KV cache breaks it (SmolLM3's config keeps
``use_cache=True``, and with a cache transformers skips the packed-sequence check): every training forward passes
``use_cache=False`` (``smolfsdp.train.steps``; TRL's ``compute_loss`` does the same). ``tests/test_packing.py``
checks that a packed row's logits equal each row's logits run alone.

    python -c "from smolfsdp.data.packing import pack_rows; help(pack_rows)"
"""

from __future__ import annotations

from typing import Any

import torch

from smolfsdp.errors import ConfigError

#: TRL's packing strategy used here: best fit decreasing, row boundaries kept (``trl.data_utils.pack_dataset``)
PACKING_STRATEGY = "bfd"


def pads(cfg) -> bool:
    """Whether the run's micro-batches are padded (neither ``packing`` nor ``padding_free``)."""
    return not (cfg.packing or cfg.padding_free)


def build_collator(pad_token_id: int, cfg) -> Any:
    """TRL's ``DataCollatorForLanguageModeling`` for run config ``cfg``: padding-free when ``cfg.packing`` or
    ``cfg.padding_free`` (what ``SFTTrainer`` builds for the same ``SFTConfig`` fields), padded otherwise."""
    from trl.trainer.sft_trainer import (
        DataCollatorForLanguageModeling,
    )  # deferred: trl takes seconds to import

    return DataCollatorForLanguageModeling(pad_token_id=pad_token_id, padding_free=not pads(cfg))


def sft_collation_args(cfg) -> dict[str, Any]:
    """The TRL engine's ``SFTConfig`` fields for the run's collation, so ``SFTTrainer`` builds the collator of
    :func:`build_collator`. ``packing`` there only switches the padding-free collator on (the engine passes
    ``skip_prepare_dataset``, so TRL packs nothing itself: :func:`pack_rows` packed already). ``padding_free``
    without packing needs ``max_length=None``: TRL refuses it otherwise because it would not cut rows, and
    ``smolfsdp.data.prepare`` already did. Padding-free batches count every input token as seen (there is no
    padding; the Trainer's ``non_padding`` count without an attention mask skips real tokens equal to the pad id)."""
    free_only = cfg.padding_free and not cfg.packing
    return {
        "packing": cfg.packing,
        "padding_free": not pads(cfg),
        "max_length": None if free_only else cfg.max_length,
        "include_num_input_tokens_seen": "non_padding" if pads(cfg) else "all",
    }


def pack_rows(ds, max_length: int):
    """``ds`` (``input_ids``, ``labels``: one tokenised row each) packed by TRL's BFD into rows of at most
    ``max_length`` tokens, with TRL's ``seq_lengths`` column (the lengths of the rows each packed row holds).

    Raises:
        ConfigError: a row longer than ``max_length`` (``smolfsdp.data.prepare`` never keeps one; BFD would cut it).
    """
    from trl.data_utils import pack_dataset  # deferred: trl takes seconds to import

    longest = max((len(r) for r in ds["input_ids"]), default=0)
    if longest > max_length:
        raise ConfigError(
            f"a row of {longest} tokens is longer than max_length={max_length}: packing would cut it; "
            "tokenise with the same max_length (smolfsdp.data.prepare drops or truncates such rows)."
        )
    return pack_dataset(ds.select_columns(["input_ids", "labels"]), max_length, strategy=PACKING_STRATEGY)


def packing_stats(rows, packed, max_length: int) -> dict[str, Any]:
    """One split's packing, every row accounted for: ``rows`` (tokenised rows in), ``packed_rows`` (out),
    ``rows_in_packed`` (rows the packed ones hold: equals ``rows``), ``real_tokens`` (the rows' tokens, before and
    after: nothing cut) and ``packing_fill`` = real tokens / (packed rows x ``max_length``), how full the
    ``max_length`` rows are. Raises AssertionError if a row or a token was lost."""
    lengths = [len(r) for r in rows["input_ids"]]
    seq_lengths = [n for s in packed["seq_lengths"] for n in s]
    if sorted(lengths) != sorted(seq_lengths):
        raise AssertionError(f"packing lost rows or tokens: {len(lengths)} rows in, {len(seq_lengths)} out")
    real = sum(lengths)
    return {
        "rows": len(lengths),
        "packed_rows": len(packed),
        "rows_in_packed": len(seq_lengths),
        "real_tokens": real,
        "packing_fill": round(real / max(len(packed) * max_length, 1), 4),
    }


def count_real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Input tokens of a collated micro-batch that are rows, not padding: the ``attention_mask`` ones when the
    batch is padded, every token of the flattened row when it is padding-free (it has no padding)."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return int(batch["input_ids"].numel())


def count_computed_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Input tokens a micro-batch makes the model compute: ``batch x sequence`` of ``input_ids``, padding included."""
    return int(batch["input_ids"].numel())


def attention_seq_len(batch: dict[str, torch.Tensor]) -> float:
    """The sequence length a micro-batch's attention FLOPs go with, per token: the padded row length for a padded
    batch; for a padding-free one, each token attends within its own row, so the token-weighted mean row length
    ``sum(l_i^2) / sum(l_i)`` over the rows the flattened row holds (rows restart at ``position_ids`` 0)."""
    if "position_ids" not in batch or "attention_mask" in batch:
        return float(batch["input_ids"].shape[1])
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [batch["position_ids"].shape[1]]
    lengths = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    return sum(n * n for n in lengths) / max(sum(lengths), 1)


def flatten_full_rows(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A padded-shape batch of full rows (``input_ids``, ``labels``: ``(rows, seq_len)``, no padding) as the
    padding-free collator hands it over: one row of ``rows x seq_len`` tokens, ``position_ids`` restarting at each
    row, the label at each row start -100. The full-size dry run's packed micro-batch (every packed row full)."""
    rows, seq_len = batch["input_ids"].shape
    pos = torch.arange(seq_len).repeat(rows)[None]
    labels = batch["labels"].reshape(1, -1).clone()
    labels[pos == 0] = -100
    return {"input_ids": batch["input_ids"].reshape(1, -1), "labels": labels, "position_ids": pos}


def check_rows_apart(batch: dict[str, torch.Tensor]) -> None:
    """Raise ValueError for a micro-batch that holds several rows in one (``position_ids`` restart at 0 inside a
    row) and an ``attention_mask``: transformers then builds a plain causal mask and the rows attend to each other
    (TRL's padding-free collator never sends one; ``tests/test_packing.py`` shows the difference)."""
    pos = batch.get("position_ids")
    if pos is None or "attention_mask" not in batch:
        return
    if bool((pos[:, 1:] == 0).any()):
        raise ValueError(
            "a padding-free batch (position_ids restart inside a row) came with an attention_mask: its rows would "
            "attend to each other; collate with smolfsdp.data.packing.build_collator (no attention_mask)."
        )


def collation(cfg) -> str:
    """``packed``, ``padding_free`` or ``padded``: how the run's micro-batches are made."""
    return "packed" if cfg.packing else "padding_free" if cfg.padding_free else "padded"


def token_share(cfg, real: int, computed: int) -> dict[str, Any]:
    """The ``summary.json`` ``data`` fields for the tokens a run trained on (all ranks, this launch's steps):
    ``collation``, ``train_tokens_real``, ``train_tokens_computed`` and ``real_token_share`` = real / computed
    (None before any step). Padded batches compute their padding too; padding-free and packed ones compute only
    rows (share 1.0), and packing also makes every micro-batch nearly ``batch x max_length`` tokens."""
    return {
        "collation": collation(cfg),
        "train_tokens_real": real,
        "train_tokens_computed": computed,
        "real_token_share": round(real / computed, 4) if computed else None,
    }


def token_share_line(fields: dict[str, Any]) -> str:
    """The line rank 0 logs: ``tokens: 12,345 real of 12,900 computed (95.7 % real; padded batches)``."""
    share = fields["real_token_share"]
    pct = "n/a" if share is None else f"{100 * share:.1f} %"
    return (
        f"tokens: {fields['train_tokens_real']:,} real of {fields['train_tokens_computed']:,} computed "
        f"({pct} real; {fields['collation'].replace('_', '-')} batches)"
    )
