"""Medical Q&A rows -> chat messages -> tokens with assistant-only labels, every row accounted for.

Used by the fine-tune chapter and by both engines (``smolfsdp.train.sft``). Rows come from the bundled
sample (``data/medical_qa/``), a local file (.jsonl, .json, .csv, .parquet; layouts and encoding in
``smolfsdp.data.files``) or a hub data set; a column mapping turns them into ``[system?, user, assistant]``
messages; the tokenizer's chat template turns those into ``input_ids`` and ``labels`` where every
non-assistant token is ``-100``. This module holds the rules below and the accounting; the column
mappings live in ``smolfsdp.data.columns``, the chat template and tokens in ``smolfsdp.data.chat``.

Rules (also in the README's data paragraph):

* **Field types.** A string is used as it is (stripped). A list of strings is joined with newlines, one
  item per line (``["fever", "cough"]`` -> ``"fever\ncough"``). An int or float is its decimal text.
  ``None``, NaN, an empty or blank string: the field is empty. Anything else (an object, a nested list, a
  boolean) is refused with a ConfigError naming the row and the column.
* **Row accounting.** Every row read is counted once: ``kept``, ``dropped_empty_question``,
  ``dropped_empty_answer`` or ``dropped_too_long``; they sum to ``rows_in``. ``reasoning_cut``,
  ``truncated`` and ``duplicate_questions`` count kept rows. :meth:`PreparedData.stats` holds them (the run's
  ``summary.json`` ``data``) and rank 0 logs them by reason.
* **Too long** (more than ``max_length`` tokens). ``too_long: drop`` (the default) never cuts an answer:
  with ``include_reasoning`` the reasoning is shortened (its end is cut) until the whole conversation,
  the answer and the template's end-of-turn token fit; a row that does not fit even so, or has no
  reasoning to cut, is dropped and counted. ``too_long: truncate`` cuts the row at ``max_length`` tokens
  (counted as ``truncated``): such a row loses the end of its answer and its end-of-turn token, so a
  model trained on many learns not to stop; it is meant for throughput drills only.
* **Long fields are cut by characters before tokenizing.** A field of more than
  ``max_length x CHARS_PER_TOKEN_BOUND`` characters cannot fit in ``max_length`` tokens, so it is never
  tokenized in full: a question or answer that long makes the row too long at once (dropped, or cut to
  that many characters first under ``too_long: truncate``); a reasoning that long is cut to that many
  characters before the token-level cut.
* **Duplicates.** Rows whose question (case and whitespace ignored) repeats an earlier kept row's are
  counted (``duplicate_questions``) and kept for training; the eval split takes whole questions, so no
  question is in both splits.
* **Dates.** Chat templates that call ``strftime_now`` (SmolLM3's writes ``Today Date: ...`` into every
  system turn) render :data:`TEMPLATE_DATE` instead of today (:func:`pin_template_date`), so a row's
  tokens do not depend on the day it is tokenized.

    python -c "from smolfsdp.data.files import load_rows; print(load_rows('bundled'))"
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from smolfsdp.data.chat import (
    build_messages,
    check_chat_template,
    fit_reasoning,
    tokenize_messages,
)
from smolfsdp.data.columns import resolve_mapping, row_fields
from smolfsdp.data.files import load_rows
from smolfsdp.data.packing import pack_rows, packing_stats
from smolfsdp.errors import ConfigError

log = logging.getLogger(__name__)


#: No tokenizer's tokens average more characters than this on text (byte-level BPEs average ~4 on English;
#: the bundled one's longest token is 13 characters), so a field longer than ``max_length`` times this
#: cannot fit in ``max_length`` tokens and is never tokenized in full (a 50 MB answer costs nothing).
CHARS_PER_TOKEN_BOUND = 32

TOO_LONG_POLICIES = ("drop", "truncate")


@dataclass
class PreparedData:
    """Tokenised train/eval splits plus the fate of every row read (for the run summary).

    ``counts`` holds ``rows_in`` and the four outcomes that sum to it (``kept``,
    ``dropped_empty_question``, ``dropped_empty_answer``, ``dropped_too_long``) and, among kept rows,
    ``reasoning_cut``, ``truncated``, ``duplicate_questions``.
    """

    train: Any  # datasets.Dataset with input_ids, labels
    eval: Any | None
    mapping: str
    counts: dict[str, int] = field(default_factory=dict)
    too_long: str = "drop"
    #: with ``packing``: ``{"train": ..., "eval": ...}`` of ``smolfsdp.data.packing.packing_stats``; the splits
    #: then hold packed rows (``seq_lengths`` column), and ``train_rows``/``eval_rows`` still count tokenised rows
    packing: dict[str, Any] | None = None

    @property
    def n_rows(self) -> int:
        return self.counts["rows_in"]

    @property
    def n_truncated(self) -> int:
        return self.counts["truncated"]

    def split_rows(self) -> dict[str, int]:
        """The kept rows' train/eval split, in tokenised rows (before any packing)."""
        if self.packing is not None:
            return {
                "train_rows": self.packing["train"]["rows"],
                "eval_rows": self.packing.get("eval", {}).get("rows", 0),
            }
        return {"train_rows": len(self.train), "eval_rows": 0 if self.eval is None else len(self.eval)}

    def row_counts(self) -> dict[str, int]:
        """Every row accounted for, counts only: rows in, each outcome, the notes on kept rows
        (reasoning cut, truncated, duplicate questions), and the kept rows' train/eval split."""
        return {**{k: v for k, v in self.counts.items() if isinstance(v, int)}, **self.split_rows()}

    def stats(self) -> dict[str, Any]:
        """The run's ``summary.json`` ``data``: the mapping, every row's fate, the split, and with ``packing`` each
        split's packed rows (``smolfsdp.data.packing.packing_stats``)."""
        out = {"mapping": self.mapping, **self.counts, "too_long": self.too_long, **self.split_rows()}
        if self.packing is not None:
            out["packing"] = self.packing
        return out


OUTCOMES = ("kept", "dropped_empty_question", "dropped_empty_answer", "dropped_too_long")


def encode_row(question: str, answer: str, reasoning: str, tokenizer, cfg) -> tuple[str, dict | None, str]:
    """One row's outcome under ``cfg`` (a TrainConfig): ``(outcome, tokens or None, note)`` where outcome is
    one of :data:`OUTCOMES` and note is ``""``, ``"reasoning_cut"`` or ``"truncated"``."""
    if not question:
        return "dropped_empty_question", None, ""
    if not answer:
        return "dropped_empty_answer", None, ""
    bound = cfg.max_length * CHARS_PER_TOKEN_BOUND
    truncate = cfg.too_long == "truncate"
    if max(len(question), len(answer)) > bound and not truncate:
        return "dropped_too_long", None, ""  # cannot fit: never tokenized in full
    question, answer = question[:bound], answer[:bound]
    reasoning = reasoning[:bound] if cfg.include_reasoning else ""
    msgs = build_messages(question, answer, reasoning, system_prompt=cfg.system_prompt)
    out = tokenize_messages(msgs, tokenizer, cfg.max_length)
    if not out["truncated"]:
        return "kept", out, ""
    if truncate:
        return ("kept", out, "truncated") if out["n_assistant_tokens"] else ("dropped_too_long", None, "")
    if reasoning:
        fitted = fit_reasoning(question, answer, reasoning, tokenizer, cfg.max_length, cfg.system_prompt)
        if fitted is not None:
            return "kept", fitted, "reasoning_cut"
    return "dropped_too_long", None, ""


def question_key(question: str) -> str:
    """Questions equal up to case and whitespace share a key (duplicates)."""
    return " ".join(question.lower().split())


def split_by_question(keys: list[str], n_eval: int, seed: int) -> tuple[list[int], list[int]]:
    """Row indices ``(train, eval)``: whole questions (all rows sharing a key) go to eval, in a
    seeded random order, until it holds at least ``n_eval`` rows."""
    groups: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    order = list(groups)
    random.Random(seed).shuffle(order)
    eval_idx: list[int] = []
    for k in order:
        if len(eval_idx) >= n_eval:
            break
        eval_idx += groups[k]
    held = set(eval_idx)
    return [i for i in range(len(keys)) if i not in held], sorted(eval_idx)


def log_counts(counts: dict[str, int], cfg) -> None:
    """One line per reason (rank 0 logs INFO; the other ranks log WARNING and up only)."""
    log.info(
        "data %s: %d rows read, %d kept (%d with their reasoning cut, %d truncated), %d duplicate questions",
        cfg.dataset,
        counts["rows_in"],
        counts["kept"],
        counts["reasoning_cut"],
        counts["truncated"],
        counts["duplicate_questions"],
    )
    for reason in OUTCOMES[1:]:
        if counts[reason]:
            log.info("data: %d rows dropped: %s", counts[reason], drop_reason(reason, cfg))


def drop_reason(reason: str, cfg) -> str:
    """Why rows of outcome ``reason`` (one of :data:`OUTCOMES` but ``kept``) were dropped, and the way out."""
    what = reason.removeprefix("dropped_").replace("_", " ")
    if reason != "dropped_too_long":
        return what
    if cfg.too_long == "truncate":
        return (
            f"{what}: the prompt alone fills max_length={cfg.max_length} tokens, leaving no answer token to "
            "learn from; raise max_length to keep them"
        )
    return (
        f"{what}: more than max_length={cfg.max_length} tokens as a chat, and an answer is never cut "
        "(too_long: drop); they never reach the model. Raise max_length to keep them"
    )


def too_long_hint(counts: dict[str, int], cfg) -> str:
    """A sentence for errors about too few rows: how many were dropped as too long, and the way out."""
    n = counts.get("dropped_too_long", 0)
    if not n or cfg.too_long != "drop":
        return ""
    return (
        f" ({n} of the {counts['rows_in']} rows read were dropped as longer than max_length={cfg.max_length}: "
        "raise max_length, or set too_long: truncate for a drill that only exercises the mechanics.)"
    )


def prepare_data(cfg, tokenizer) -> PreparedData:
    """Load, map, tokenise and split the data for run config ``cfg`` (a TrainConfig).

    Raises:
        ConfigError: missing file, no matching columns, a field that is not text, no rows left, no chat
            template, or ``max_length`` too small for any row.
    """
    import datasets  # deferred: datasets (pyarrow) is heavy; only building the split needs it

    check_chat_template(tokenizer)
    rows = load_rows(cfg.dataset, config=cfg.dataset_config, split=cfg.dataset_split, max_rows=cfg.max_rows)
    mname, mapping = resolve_mapping(rows.column_names, cfg.columns)
    kept, keys, counts = encode_rows(rows, mapping, tokenizer, cfg)
    log_counts(counts, cfg)
    if counts["kept"] == 0:
        raise ConfigError(_nothing_kept(counts, cfg))
    data = datasets.Dataset.from_dict(kept)
    n_eval = int(cfg.eval_size) if cfg.eval_size >= 1 else round(cfg.eval_size * len(data))
    eval_ds = None
    if n_eval > 0:
        train_idx, eval_idx = split_by_question(keys, n_eval, cfg.seed)
        if not train_idx:
            raise ConfigError(
                f"eval_size={cfg.eval_size} leaves no training rows out of {len(data)} ({len(set(keys))} "
                "distinct questions)."
            )
        data, eval_ds = data.select(train_idx), data.select(eval_idx)
    prepared = PreparedData(data, eval_ds, mname, counts, cfg.too_long)
    return pack_splits(prepared, cfg.max_length) if cfg.packing else prepared


def pack_splits(prepared: PreparedData, max_length: int) -> PreparedData:
    """Both splits packed by TRL's BFD into rows of at most ``max_length`` tokens (``smolfsdp.data.packing``), the
    count of each split's packed rows recorded (rank 0 logs it). The eval split is packed too: its loss is the
    token-weighted mean over the same label tokens either way (``smolfsdp.train.steps.evaluate``), and packed it
    takes fewer forwards."""
    splits = {"train": prepared.train, "eval": prepared.eval}
    stats, packed = {}, {}
    for name, ds in splits.items():
        if ds is None:
            continue
        packed[name] = pack_rows(ds, max_length)
        stats[name] = packing_stats(ds, packed[name], max_length)
        s = stats[name]
        log.info(
            "data: %s split packed (TRL BFD): %d rows -> %d rows of at most %d tokens, %.1f%% full (%d real tokens)",
            name, s["rows"], s["packed_rows"], max_length, 100 * s["packing_fill"], s["real_tokens"],
        )  # fmt: skip
    prepared.train, prepared.eval, prepared.packing = packed["train"], packed.get("eval"), stats
    return prepared


def encode_rows(
    rows, mapping: dict[str, str], tokenizer, cfg
) -> tuple[dict[str, list], list[str], dict[str, int]]:
    """Every row through :func:`encode_row`: ``(kept input_ids and labels, the kept rows' question keys,
    the counts)``; each row read is counted once among :data:`OUTCOMES`."""
    counts = dict.fromkeys(("rows_in", *OUTCOMES, "reasoning_cut", "truncated", "duplicate_questions"), 0)
    counts["rows_in"] = len(rows)
    kept: dict[str, list] = {"input_ids": [], "labels": []}
    keys: list[str] = []
    for i, row in enumerate(rows):
        question, answer, reasoning = row_fields(row, mapping, i)
        outcome, out, note = encode_row(question, answer, reasoning, tokenizer, cfg)
        counts[outcome] += 1
        if note:
            counts[note] += 1
        if out is not None:
            kept["input_ids"].append(out["input_ids"])
            kept["labels"].append(out["labels"])
            keys.append(question_key(question))
    counts["duplicate_questions"] = len(keys) - len(set(keys))
    return kept, keys, counts


def _nothing_kept(counts: dict[str, int], cfg) -> str:
    """Why no row was kept, and what to change."""
    if counts["dropped_too_long"] and cfg.too_long == "truncate":
        return (
            f"max_length={cfg.max_length} is too small: in every row the prompt alone fills it, so no answer "
            "token is left to learn from. Raise max_length."
        )
    if counts["dropped_too_long"]:
        return (
            f"max_length={cfg.max_length} is too small: all {counts['dropped_too_long']} rows with a question "
            "and an answer are longer, and an answer is never cut (too_long: drop). Raise max_length."
        )
    return f"No rows with a non-empty question and answer are left in {cfg.dataset!r}."
