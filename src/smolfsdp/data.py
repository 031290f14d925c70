"""Medical Q&A rows -> chat messages -> tokens with assistant-only labels.

Used by the fine-tune chapter and by both engines (``smolfsdp.sft``). Rows come from the bundled
sample (``data/medical_qa/``), a local file (.jsonl, .json, .csv, .parquet) or a hub data set; a
column mapping turns them into ``[system?, user, assistant]`` messages; the tokenizer's chat template
turns those into ``input_ids`` and ``labels`` where every non-assistant token is ``-100``.

    python -c "from smolfsdp.data import load_rows; print(load_rows('bundled'))"
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smolfsdp.config import ConfigError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # the label value torch.nn.CrossEntropyLoss (and HF's loss) skips

#: Column layouts of the usual medical Q&A sets. Keys: the role each column plays.
COLUMN_MAPPINGS: dict[str, dict[str, str]] = {
    # FreedomIntelligence/medical-o1-reasoning-SFT and the bundled sample
    "medical_o1": {"question": "Question", "reasoning": "Complex_CoT", "answer": "Response"},
    # MedQuAD-style sets (e.g. keivalya/MedQuad-MedicalQnADataset, ../shared/data/medquad_*.jsonl)
    "question_answer": {"question": "Question", "answer": "Answer"},
    # Alpaca-style instruction sets (e.g. medalpaca/medical_meadow_*)
    "instruction": {"question": "instruction", "context": "input", "answer": "output"},
}

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def repo_root() -> Path:
    """The repository root (this package is installed in editable mode from ``src/``)."""
    return Path(__file__).resolve().parents[2]


def bundled_data_path() -> Path:
    return repo_root() / "data" / "medical_qa" / "medical_qa_sample.jsonl"


def bundled_tokenizer_path() -> Path:
    return repo_root() / "data" / "tokenizer"


# ---------------------------------------------------------------------------- loading
def load_rows(
    dataset: str = "bundled", *, config: str | None = None, split: str = "train", max_rows: int | None = None
):
    """Load raw rows as a ``datasets.Dataset``.

    Args:
        dataset: ``"bundled"``, a path to a .jsonl/.json/.csv/.parquet file, or a hub id.
        config: hub config name (hub ids only).
        split: hub split (hub ids only; local files are one split).
        max_rows: keep the first N rows (None: all).

    Raises:
        ConfigError: the file does not exist, has an unsupported extension, or holds no rows.
    """
    import datasets

    datasets.disable_progress_bars()  # row counts are logged instead; bars from every rank are noise
    if dataset == "bundled":
        dataset = str(bundled_data_path())
    path = Path(dataset).expanduser()
    looks_local = path.suffix.lower() in FILE_FORMATS or dataset.startswith((".", "/", "~")) or path.exists()
    if looks_local:
        if not path.is_file():
            raise ConfigError(
                f"Data file {str(path)!r} does not exist. Give an existing .jsonl/.json/.csv/.parquet file, "
                "a hub id (e.g. FreedomIntelligence/medical-o1-reasoning-SFT), or 'bundled'."
            )
        fmt = FILE_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(
                f"Unsupported data file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)}."
            )
        if path.stat().st_size == 0:
            raise ConfigError(
                f"Data file {str(path)!r} is empty; it needs one question/answer row per line (jsonl)."
            )
        try:
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
        except Exception as err:  # datasets' builders raise many types; name the file and the cause
            raise ConfigError(
                f"Could not read {str(path)!r} as {fmt}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            ) from err
    else:
        ds = datasets.load_dataset(dataset, config, split=split)
    if len(ds) == 0:
        raise ConfigError(f"{dataset!r} holds no rows.")
    if max_rows is not None:
        ds = ds.select(range(min(max_rows, len(ds))))
    return ds


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


def to_messages(
    row: dict[str, Any],
    mapping: dict[str, str],
    *,
    include_reasoning: bool = False,
    system_prompt: str | None = None,
) -> list[dict[str, str]]:
    """One row -> ``[system?, user, assistant]`` chat messages.

    With ``include_reasoning`` and a reasoning column, the assistant turn is
    ``<think>\\n{reasoning}\\n</think>\\n{answer}`` (SmolLM3's thinking format).
    """
    question = str(row[mapping["question"]]).strip()
    context = str(row.get(mapping.get("context", ""), "") or "").strip()
    if context:
        question = f"{question}\n\n{context}"
    answer = str(row[mapping["answer"]]).strip()
    reasoning = str(row.get(mapping.get("reasoning", ""), "") or "").strip()
    if include_reasoning and reasoning:
        answer = f"<think>\n{reasoning}\n</think>\n{answer}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages


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


def tokenize_messages(messages: list[dict[str, str]], tokenizer, max_length: int) -> dict[str, Any]:
    """Chat messages -> ``input_ids``, ``labels`` (non-assistant tokens = -100), truncation info.

    Uses the template's ``{% generation %}`` markers (``return_assistant_tokens_mask``) when it has
    them; otherwise masks the prompt rendered with ``add_generation_prompt=True`` (it must be a prefix
    of the full conversation, which is checked).

    Returns a dict with ``input_ids`` (list[int], len <= max_length), ``labels`` (same length),
    ``truncated`` (bool) and ``n_assistant_tokens`` (int, after truncation).
    """
    check_chat_template(tokenizer)
    if has_generation_markers(tokenizer):
        enc = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
    else:
        ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        prompt = list(
            tokenizer.apply_chat_template(
                messages[:-1], tokenize=True, return_dict=True, add_generation_prompt=True
            )["input_ids"]
        )
        if ids[: len(prompt)] != prompt:
            raise ConfigError(
                "The chat template renders the prompt differently inside the full conversation, so the "
                "assistant tokens cannot be located. Use a template with {% generation %} markers."
            )
        mask = [0] * len(prompt) + [1] * (len(ids) - len(prompt))
    truncated = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
    return {"input_ids": ids, "labels": labels, "truncated": truncated, "n_assistant_tokens": int(sum(mask))}


@dataclass
class PreparedData:
    """Tokenised train/eval splits plus what happened on the way (for the run summary)."""

    train: Any  # datasets.Dataset with input_ids, labels
    eval: Any | None
    mapping: str
    n_rows: int
    n_truncated: int
    n_dropped_no_answer: int

    def stats(self) -> dict[str, Any]:
        return {
            "mapping": self.mapping,
            "rows": self.n_rows,
            "train_rows": len(self.train),
            "eval_rows": 0 if self.eval is None else len(self.eval),
            "truncated_rows": self.n_truncated,
            "dropped_rows_no_answer_tokens": self.n_dropped_no_answer,
        }


def prepare_data(cfg, tokenizer) -> PreparedData:
    """Load, map, tokenise and split the data for run config ``cfg`` (a TrainConfig).

    Raises:
        ConfigError: missing file, no matching columns, empty data after filtering, no chat
            template, or ``max_length`` too small for any answer token.
    """
    check_chat_template(tokenizer)
    rows = load_rows(cfg.dataset, config=cfg.dataset_config, split=cfg.dataset_split, max_rows=cfg.max_rows)
    mname, mapping = resolve_mapping(rows.column_names, cfg.columns)
    rows = rows.filter(
        lambda r: (
            bool(str(r[mapping["question"]] or "").strip()) and bool(str(r[mapping["answer"]] or "").strip())
        ),
        keep_in_memory=True,
    )
    if len(rows) == 0:
        raise ConfigError(f"No rows with a non-empty question and answer are left in {cfg.dataset!r}.")

    def encode(row):
        msgs = to_messages(
            row, mapping, include_reasoning=cfg.include_reasoning, system_prompt=cfg.system_prompt
        )
        return tokenize_messages(msgs, tokenizer, cfg.max_length)

    tokenised = rows.map(encode, remove_columns=rows.column_names, desc="tokenising", keep_in_memory=True)
    n_truncated = int(sum(tokenised["truncated"]))
    keep = tokenised.filter(lambda r: r["n_assistant_tokens"] > 0, keep_in_memory=True)
    n_dropped = len(tokenised) - len(keep)
    if len(keep) == 0:
        raise ConfigError(
            f"max_length={cfg.max_length} is too small: in every row the prompt alone fills it, so no answer "
            "token is left to learn from. Raise max_length."
        )
    if n_truncated:
        log.info(
            "%d of %d rows were longer than max_length=%d and were truncated",
            n_truncated,
            len(rows),
            cfg.max_length,
        )
    if n_dropped:
        log.info("%d rows kept no answer token after truncation and were dropped", n_dropped)
    keep = keep.remove_columns(["truncated", "n_assistant_tokens"])
    eval_ds = None
    n_eval = int(cfg.eval_size) if cfg.eval_size >= 1 else round(cfg.eval_size * len(keep))
    if n_eval > 0:
        if n_eval >= len(keep):
            raise ConfigError(f"eval_size={cfg.eval_size} leaves no training rows out of {len(keep)}.")
        split = keep.train_test_split(test_size=n_eval, seed=cfg.seed, shuffle=True)
        keep, eval_ds = split["train"], split["test"]
    return PreparedData(keep, eval_ds, mname, len(rows), n_truncated, n_dropped)
