"""Column mappings: which column of a medical Q&A set is the question, the answer, the reasoning, and
how one field becomes text.

Used by ``smolfsdp.data.prepare`` (the fine-tune chapter, both engines); the rules are in that module's
docstring and the README's data paragraph.

    python -c "from smolfsdp.data.columns import COLUMN_MAPPINGS; print(COLUMN_MAPPINGS)"
"""

from __future__ import annotations

import math
from typing import Any

from smolfsdp.errors import ConfigError

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
