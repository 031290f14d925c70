"""Medical Q&A rows -> chat messages -> tokens with assistant-only labels, every row accounted for.

Used by the fine-tune chapter and by both engines (``smolfsdp.train.sft``). Rows come from the bundled
sample (``data/medical_qa/``), a local file (.jsonl, .json, .csv, .parquet; layouts and encoding in
``smolfsdp.data.files``) or a hub data set; a column mapping turns them into ``[system?, user, assistant]``
messages; the tokenizer's chat template turns those into ``input_ids`` and ``labels`` where every
non-assistant token is ``-100``.

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

    python -c "from smolfsdp.data.prepare import load_rows; print(load_rows('bundled'))"
"""

from __future__ import annotations

import functools
import logging
import math
import random
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from smolfsdp.data.files import FILE_FORMATS, load_rows
from smolfsdp.errors import ConfigError

__all__ = ["FILE_FORMATS", "load_rows"]  # re-exported: data's public face (paths live in smolfsdp.paths)

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # the label value torch.nn.CrossEntropyLoss (and HF's loss) skips

#: No tokenizer's tokens average more characters than this on text (byte-level BPEs average ~4 on English;
#: the bundled one's longest token is 13 characters), so a field longer than ``max_length`` times this
#: cannot fit in ``max_length`` tokens and is never tokenized in full (a 50 MB answer costs nothing).
CHARS_PER_TOKEN_BOUND = 32

#: The date every chat template that calls ``strftime_now`` renders (SmolLM3's "Today Date: ..."; its
#: "Knowledge Cutoff Date" is June 2025): pinned so the tokens of a row are the same on every day.
TEMPLATE_DATE = datetime(2025, 6, 1)

TOO_LONG_POLICIES = ("drop", "truncate")

#: Column layouts of the usual medical Q&A sets. Keys: the role each column plays.
COLUMN_MAPPINGS: dict[str, dict[str, str]] = {
    # FreedomIntelligence/medical-o1-reasoning-SFT and the bundled sample
    "medical_o1": {"question": "Question", "reasoning": "Complex_CoT", "answer": "Response"},
    # MedQuAD-style sets (e.g. keivalya/MedQuad-MedicalQnADataset, ../shared/data/medquad_*.jsonl)
    "question_answer": {"question": "Question", "answer": "Answer"},
    # Alpaca-style instruction sets (e.g. medalpaca/medical_meadow_*)
    "instruction": {"question": "instruction", "context": "input", "answer": "output"},
}


def resolve_mapping(columns, name: str = "auto") -> tuple[str, dict[str, str]]:
    """Pick the column mapping for a data set with ``columns``.

    Returns ``(mapping_name, mapping)``. Raises ConfigError listing the columns found and the
    mappings known when none fits.
    """
    columns = list(columns)
    if name != "auto":
        if name not in COLUMN_MAPPINGS:
            raise ConfigError(
                f"columns={name!r} is not a known mapping; use 'auto' or one of {list(COLUMN_MAPPINGS)}."
            )
        candidates = {name: COLUMN_MAPPINGS[name]}
    else:
        candidates = COLUMN_MAPPINGS
    for mname, mapping in candidates.items():
        required = [c for role, c in mapping.items() if role in ("question", "answer")]
        if all(c in columns for c in required):
            return mname, mapping
    known = "; ".join(f"{k}: {sorted(set(v.values()))}" for k, v in candidates.items())
    raise ConfigError(
        f"The data's columns {columns} match no column mapping ({known}). Rename the columns, or pick a "
        "mapping with columns=... that fits."
    )


def field_text(value: Any, column: str, row: int | None = None) -> str:
    """One field as text by the module's rule (strings, lists of strings, numbers; empty -> ``""``).

    Raises:
        ConfigError: an object, a nested list, a boolean or another type, naming ``row`` and ``column``.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return "\n".join(v.strip() for v in value if v.strip())
    where = f"row {row}" if row is not None else "a row"
    raise ConfigError(
        f"{where}, column {column!r}: a {type(value).__name__} ({str(value)[:60]!r}) is not text. Fields must be "
        "strings, lists of strings (joined with newlines) or numbers; fix the row or drop it from the data."
    )


def row_fields(
    row: dict[str, Any], mapping: dict[str, str], index: int | None = None
) -> tuple[str, str, str]:
    """``(question, answer, reasoning)`` of one row as text; the context column (if any) follows the question."""

    def get(role: str) -> str:
        column = mapping.get(role)
        return field_text(row.get(column), column, index) if column else ""

    question, context = get("question"), get("context")
    if question and context:
        question = f"{question}\n\n{context}"
    return question, get("answer"), get("reasoning")


def build_messages(
    question: str, answer: str, reasoning: str = "", *, system_prompt: str | None = None
) -> list[dict[str, str]]:
    """``[system?, user, assistant]``; a non-empty ``reasoning`` goes first in the assistant turn as
    ``<think>\n{reasoning}\n</think>\n{answer}`` (SmolLM3's thinking format)."""
    if reasoning:
        answer = f"<think>\n{reasoning}\n</think>\n{answer}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def to_messages(
    row: dict[str, Any],
    mapping: dict[str, str],
    *,
    include_reasoning: bool = False,
    system_prompt: str | None = None,
) -> list[dict[str, str]]:
    """One row -> ``[system?, user, assistant]`` chat messages (fields converted by :func:`field_text`).

    With ``include_reasoning`` and a reasoning column, the assistant turn is
    ``<think>\n{reasoning}\n</think>\n{answer}`` (SmolLM3's thinking format).
    """
    question, answer, reasoning = row_fields(row, mapping)
    return build_messages(
        question, answer, reasoning if include_reasoning else "", system_prompt=system_prompt
    )


# ---------------------------------------------------------------------------- tokenising
def check_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"The tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, so chat messages "
            "cannot be turned into tokens. Use a tokenizer that ships one (the model's own, or the bundled "
            "data/tokenizer), or set tokenizer.chat_template before training."
        )


def has_generation_markers(tokenizer) -> bool:
    """Whether the chat template marks assistant turns with ``{% generation %}`` (for assistant masks)."""
    return bool(re.search(r"\{%-?\s*generation\s*-?%\}", tokenizer.chat_template or ""))


_STRFTIME_CALL = re.compile(r"""strftime_now\(\s*(['"])([^'"]*)\1\s*\)""")


@functools.lru_cache(maxsize=8)
def pin_template_date(template: str) -> str:
    """``template`` with each ``strftime_now("<format>")`` call replaced by :data:`TEMPLATE_DATE` in that
    format, as a string literal (SmolLM3: ``strftime_now("%d %B %Y")`` -> ``"01 June 2025"``).

    The one place smolfsdp changes a chat template. transformers registers ``strftime_now`` (the wall
    clock) as a Jinja global and turns every extra ``apply_chat_template`` argument into plain data, so a
    function cannot be passed in its place; rewriting the call is what pins the date.

    Raises:
        ConfigError: a ``strftime_now`` call whose format is not a string literal (it cannot be pinned).
    """
    pinned = _STRFTIME_CALL.sub(lambda m: repr(TEMPLATE_DATE.strftime(m[2])), template)
    if "strftime_now" in pinned.replace("strftime_now is defined", ""):
        raise ConfigError(
            "The chat template calls strftime_now with a format that is not a string literal, so the date it "
            "writes into every example cannot be pinned; edit tokenizer.chat_template to use a literal format."
        )
    return pinned


def render_ids(messages: list[dict[str, str]], tokenizer, **kwargs) -> dict[str, Any]:
    """``tokenizer.apply_chat_template(..., tokenize=True, return_dict=True)`` with the date pinned
    (:func:`pin_template_date`)."""
    template = pin_template_date(tokenizer.get_chat_template())
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True, **kwargs
    )


def encode_chat(messages: list[dict[str, str]], tokenizer) -> tuple[list[int], list[int]]:
    """The whole conversation's token ids and its assistant mask (1 = an assistant token), uncut.

    Uses the template's ``{% generation %}`` markers (``return_assistant_tokens_mask``) when it has
    them; otherwise masks the prompt rendered with ``add_generation_prompt=True`` (it must be a prefix
    of the full conversation, which is checked).
    """
    check_chat_template(tokenizer)
    if has_generation_markers(tokenizer):
        enc = render_ids(messages, tokenizer, return_assistant_tokens_mask=True)
        return list(enc["input_ids"]), list(enc["assistant_masks"])
    ids = list(render_ids(messages, tokenizer)["input_ids"])
    prompt = list(render_ids(messages[:-1], tokenizer, add_generation_prompt=True)["input_ids"])
    if ids[: len(prompt)] != prompt:
        raise ConfigError(
            "The chat template renders the prompt differently inside the full conversation, so the "
            "assistant tokens cannot be located. Use a template with {% generation %} markers."
        )
    return ids, [0] * len(prompt) + [1] * (len(ids) - len(prompt))


def tokenize_messages(messages: list[dict[str, str]], tokenizer, max_length: int) -> dict[str, Any]:
    """Chat messages -> ``input_ids``, ``labels`` (non-assistant tokens = -100), cut at ``max_length``.

    Returns a dict with ``input_ids`` (list[int], len <= max_length), ``labels`` (same length),
    ``truncated`` (bool: tokens were cut off the end) and ``n_assistant_tokens`` (int, after the cut).
    """
    ids, mask = encode_chat(messages, tokenizer)
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
    return {"input_ids": ids, "labels": labels, "truncated": truncated, "n_assistant_tokens": int(sum(mask))}


def fit_reasoning(
    question: str, answer: str, reasoning: str, tokenizer, max_length: int, system_prompt: str | None
) -> dict[str, Any] | None:
    """Cut the end of ``reasoning`` until the whole conversation fits in ``max_length`` tokens; None when
    it cannot (the prompt and the answer alone are too long). Token counts of the pieces are not exactly
    additive (merges at the cut), so the cut is retried a few times with the measured excess."""
    r_ids = tokenizer(reasoning, add_special_tokens=False)["input_ids"]
    full = len(
        encode_chat(build_messages(question, answer, reasoning, system_prompt=system_prompt), tokenizer)[0]
    )
    keep = len(r_ids) - (full - max_length)
    for _ in range(6):
        if keep <= 0:
            return None
        cut = tokenizer.decode(r_ids[:keep]).replace("\ufffd", "").rstrip()  # no half character at the cut
        msgs = build_messages(question, answer, cut, system_prompt=system_prompt)
        out = tokenize_messages(msgs, tokenizer, max_length)
        if not out["truncated"]:
            return out
        over = len(encode_chat(msgs, tokenizer)[0]) - max_length
        keep -= max(1, over)
    return None


# ---------------------------------------------------------------------------- preparing a run's data
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

    @property
    def n_rows(self) -> int:
        return self.counts["rows_in"]

    @property
    def n_truncated(self) -> int:
        return self.counts["truncated"]

    def stats(self) -> dict[str, Any]:
        return {
            "mapping": self.mapping,
            **self.counts,
            "too_long": self.too_long,
            "train_rows": len(self.train),
            "eval_rows": 0 if self.eval is None else len(self.eval),
        }


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
            log.info(
                "data: %d rows dropped: %s", counts[reason], reason.removeprefix("dropped_").replace("_", " ")
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
    import datasets

    check_chat_template(tokenizer)
    rows = load_rows(cfg.dataset, config=cfg.dataset_config, split=cfg.dataset_split, max_rows=cfg.max_rows)
    mname, mapping = resolve_mapping(rows.column_names, cfg.columns)
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
    log_counts(counts, cfg)
    if counts["kept"] == 0:
        if counts["dropped_too_long"] and cfg.too_long == "truncate":
            raise ConfigError(
                f"max_length={cfg.max_length} is too small: in every row the prompt alone fills it, so no answer "
                "token is left to learn from. Raise max_length."
            )
        if counts["dropped_too_long"]:
            raise ConfigError(
                f"max_length={cfg.max_length} is too small: all {counts['dropped_too_long']} rows with a question "
                "and an answer are longer, and an answer is never cut (too_long: drop). Raise max_length."
            )
        raise ConfigError(f"No rows with a non-empty question and answer are left in {cfg.dataset!r}.")
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
    return PreparedData(data, eval_ds, mname, counts, cfg.too_long)
