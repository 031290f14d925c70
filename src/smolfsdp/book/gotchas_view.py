"""The gotchas' results as tables for the chapter "Debugging the seams": failing and fixed side by side.

``smolfsdp.gotchas.run_all`` runs each gotcha and returns what happened in each form as a dict (the
outcome, the exception, the measured values). This module only presents those dicts: one row per
measured quantity, the failing form in one column and the fixed form in the next, every cell as a
reader reads it (no dict or list reprs, no NaN), long messages wrapped. Nothing is computed here.

    from smolfsdp.book import gotchas_view
    from smolfsdp.gotchas import run_all as gotchas
    results = gotchas.run_gotchas(["tied_embeddings"])
    gotchas_view.section(results["tied_embeddings"])   # table + explanation, as HTML in a notebook
"""

from __future__ import annotations

import html
import re
import signal
from collections.abc import Mapping
from typing import Any

import pandas as pd

from smolfsdp.book import tables
from smolfsdp.gotchas.explained import EXPLAINED, Explained, gathered_logits_bytes, source_lines
from smolfsdp.gotchas.registry import GOTCHAS, KIND_LEGEND, WRONG, GotchaResult

FORMS = ("failing", "fixed")
SEED_FIX = "the seed's fix"  # the column of GotchaResult.seed_fix, between the failing and the fixed form
DECIMALS = 4  # a loss of 6.9995 or a change of 0.0101 must not read 7.00 / 0.01
SAID = ("outcome", "error", "message", "symptom", "why")  # folded into the outcome row, not rows of their own
PERCENT = (
    "held_per_rank",
    "weights_changed",
)  # shares (1.0 = all of it): read as "100%" or "15.6%", not 1.0000
SECONDS = "_s"  # a key ending so is in seconds: labelled "... (s)", one decimal
# the gradient-checkpointing grid's settings (smolfsdp.gotchas.cases_distributed.gradient_checkpointing), in words and order
SETTING_WORDS = {
    "none": "none (activations stored)",
    "fsdp_ac": "FSDP activation checkpointing",
    "hf_use_reentrant_false": "HF gradient_checkpointing, use_reentrant=False",
    "hf_use_reentrant_true": "HF gradient_checkpointing, use_reentrant=True",
}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name if code < 0 else f"exit code {code}"
    except ValueError:
        return f"exit code {code}"


def outcome_text(form: Mapping[str, Any], refusal: bool = False, seed: bool = False) -> str:
    """What one form did, in words: ``"error: ValueError: <first line>"``, ``"wrong result: <symptom>"``,
    ``"crash: rank0 killed by SIGSEGV"``, ``"skipped: <why>"``, ``"ran; measured below"`` or ``"ok"``;
    a form's ``why`` follows as ``". Why: ..."``.

    ``refusal``: the form is a fix, so an exception is the fix refusing early (``"refused: ..."``).
    ``seed``: the form is the seed's fix, so an exception means it does not fix this (``"still fails: ..."``).
    """
    said = _outcome_words(form, refusal, seed)
    return f"{said}. Why: {form['why']}" if form.get("why") else said


#: a single shape as a message prints it (``input sizes [[512, 128]]``, smolfsdp's CollectiveError): read as 512 × 128
_SHAPE_LIST = re.compile(r"\[\[(\d+(?:, \d+)*)\]\]")


def message_text(message: str) -> str:
    """An exception's message for a cell: a one-shape list (``[[512, 128]]``) reads ``512 × 128``; the rest as is."""
    return _SHAPE_LIST.sub(lambda m: " × ".join(m.group(1).split(", ")), message)


def _outcome_words(form: Mapping[str, Any], refusal: bool, seed: bool) -> str:
    outcome = form.get("outcome")
    if outcome == "error":
        said = "still fails" if seed else "refused" if refusal else "error"
        return f"{said}: {form.get('error')}: {message_text(form.get('message', ''))}".rstrip(": ")
    if outcome == WRONG:
        return f"wrong result: {form.get('symptom', '')}"
    if outcome == "crash":
        codes = form.get("rank_exit_codes") or {}
        died = ", ".join(f"{rank} killed by {_signal_name(code)}" for rank, code in codes.items())
        return f"crash: {died or 'torchrun exit code ' + str(form.get('torchrun_returncode'))}"
    if outcome == "skipped":
        return f"skipped: {form.get('message', '')}"
    if outcome == "measured":
        return "ran without an error; measured below"
    return str(outcome)


def _value(value: Any, key: str = "") -> str:
    """A nested attempt (a dict with an outcome) reads as its outcome and its values; a share of the
    model (:data:`PERCENT`) as a percentage; a weight difference or change exactly (``tables.difference_text``), a shape as ``2 x 24 x 128``;
    the rest as cells."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in PERCENT and number:
        return f"{value:.0%}" if float(value * 100).is_integer() else f"{value:.1%}"
    if key.endswith(SECONDS) and number:
        return tables.number_text(float(value), 1)
    if key == "max_abs_diff" and isinstance(value, float):
        return tables.difference_text(value)
    if key == "max_param_change" and isinstance(value, float):
        return "0 (no weight changed)" if value == 0.0 else tables.scientific_text(value, digits=2)
    if key == "shape" and isinstance(value, (list, tuple)):
        return " x ".join(f"{n:,}" for n in value)
    if isinstance(value, Mapping) and "outcome" in value:
        rest = "; ".join(f"{_label(k)}: {_value(v, k)}" for k, v in value.items() if k not in SAID)
        said = outcome_text(value)
        return f"{said}; {rest}" if rest else said
    return tables.cell_text(value, DECIMALS)


def _label(key: str) -> str:
    """A row label: ``group_timeout_s`` -> ``group timeout (s)``, else ``tables.readable_name``."""
    if key.endswith(SECONDS):
        return f"{tables.readable_name(key[: -len(SECONDS)])} (s)"
    return tables.readable_name(key)


def is_grid(result: GotchaResult) -> bool:
    """Both forms measured the same quantities over several settings (dicts of equal keys, no outcome)."""
    inner = [v for form in FORMS for k, v in getattr(result, form).items() if k not in SAID]
    return bool(inner) and all(
        isinstance(v, Mapping) and "outcome" not in v and v.keys() == inner[0].keys() for v in inner
    )


def grid(result: GotchaResult) -> pd.DataFrame:
    """One row per setting, labelled by what it is (``fsdp1/hf_use_reentrant_true`` -> ``FSDP1`` and
    ``HF gradient_checkpointing, use_reentrant=True``, :data:`SETTING_WORDS`), then the measured counts.

    Which settings are the failing form and which the fix is the chapter's sentence, not a column: a
    baseline (``none``) is neither.
    """
    rows = []
    for form in FORMS:
        for setting, values in getattr(result, form).items():
            if setting not in SAID:
                version, _, mode = setting.rpartition("/")
                order = list(SETTING_WORDS).index(mode) if mode in SETTING_WORDS else len(SETTING_WORDS)
                words = SETTING_WORDS.get(mode, tables.readable_name(mode))
                rows.append({"_order": (version, order), "FSDP version": version.upper(),
                             "activation recomputation": words, **values})  # fmt: skip
    frame = pd.DataFrame(rows).sort_values("_order", kind="stable").drop(columns="_order")
    frame.columns = [tables.readable_name(str(c)) for c in frame.columns]
    return frame.reset_index(drop=True)


def forms(result: GotchaResult) -> dict[str, Mapping[str, Any]]:
    """The table's columns: ``failing``, then :data:`SEED_FIX` where the seed's fix was run, then ``fixed``."""
    seed = {SEED_FIX: result.seed_fix} if result.seed_fix is not None else {}
    return {"failing": result.failing, **seed, "fixed": result.fixed}


def side_by_side(result: GotchaResult) -> pd.DataFrame:
    """Rows: ``outcome`` then each measured quantity; columns ``failing``, the seed's fix where it was
    run (:func:`forms`) and ``fixed`` (text cells).

    A quantity measured in one form only reads ``—`` in the others.
    """
    cols = forms(result)
    keys: list[str] = []
    for form in cols.values():
        keys += [k for k in form if k not in SAID and k not in keys]
    rows = {
        "outcome": [
            outcome_text(form, refusal=name == "fixed", seed=name == SEED_FIX) for name, form in cols.items()
        ]
    }
    for k in keys:
        rows[_label(k)] = [_value(form[k], k) if k in form else tables.MISSING for form in cols.values()]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=list(cols))
    frame.index.name = "what was seen"
    return frame


def overview(results: Mapping[str, GotchaResult]) -> pd.DataFrame:
    """One row per gotcha: its title, and what the failing and the fixed form did (first words)."""

    def short(form: Mapping[str, Any], refusal: bool) -> str:
        if form.get("outcome") == "error":
            return f"{'refused' if refusal else 'error'} ({form.get('error')})"
        return outcome_text(form).split(";")[0]

    return pd.DataFrame(
        [
            {"gotcha": r.title, "failing form": short(r.failing, False), "fixed form": short(r.fixed, True)}
            for r in results.values()
        ]
    )


def catalogue() -> pd.DataFrame:
    """The registered gotchas: title, name (for ``smolfsdp gotchas --run NAME``) and how each runs."""
    return pd.DataFrame(
        [{"gotcha": g.title, "name": g.name, "how it runs": KIND_LEGEND[g.kind]} for g in GOTCHAS.values()]
    )


def versions_sentence(results: Mapping[str, GotchaResult]) -> str:
    """The library versions the results were measured with, as one sentence (the gotchas are version-specific)."""
    versions = next(iter(results.values())).versions
    return "Measured with " + ", ".join(f"{name} {v}" for name, v in versions.items()) + "."


class Section:
    """A gotcha's table and its explanation, rendered as one HTML block in a notebook or a page."""

    def __init__(self, result: GotchaResult):
        self.result = result
        self.table = tables.show(grid(result) if is_grid(result) else side_by_side(result))

    def __repr__(self) -> str:  # plain-text outputs (a terminal, a text-only notebook viewer)
        thread = f"\n\nReported upstream: {self.result.thread}" if self.result.thread else ""
        return f"{self.result.title}\n{self.table.data.to_string()}\n\n{self.result.explanation}{thread}"

    def _repr_html_(self) -> str:
        said = self.table.to_html() + f"<p>{html.escape(self.result.explanation)}</p>"
        if self.result.thread:
            link = html.escape(self.result.thread)
            said += f'<p>Reported upstream: <a href="{link}">{link}</a></p>'
        return said


def section(result: GotchaResult) -> Section:
    """The chapter's call per gotcha: failing and fixed side by side, then why (HTML)."""
    return Section(result)


# --------------------------------------------------------------------------- explained, not run here
def _explained(name: str) -> Explained:
    found = [e for e in EXPLAINED if e.name == name]
    if not found:
        raise KeyError(f"no explained problem {name!r}; known: {[e.name for e in EXPLAINED]}")
    return found[0]


def explained_table() -> pd.DataFrame:
    """One row per problem the chapter explains without running it (``smolfsdp.gotchas.explained``): its
    title, why it is not run here, where the installed libraries do it (``file:line``) and the public threads."""
    return pd.DataFrame(
        [
            {"problem": e.title, "why it is not run here": e.why_not_run_here,
             "where (installed source)": "; ".join(source_lines(e)), "reported in": "; ".join(e.threads)}
            for e in EXPLAINED
        ]
    )  # fmt: skip


def explained_markdown(name: str) -> str:
    """The chapter's paragraph for one explained problem (Markdown): what happens, the fix, the installed
    source lines and the threads. Raises KeyError for an unknown name, LookupError when a cited line moved."""
    e = _explained(name)
    where = ", ".join(f"`{line}`" for line in source_lines(e))
    threads = ", ".join(f"<{t}>" for t in e.threads)
    return f"**{e.title}.** {e.what_happens} **Fix:** {e.fix} **Where:** {where}. **Reported:** {threads}."


def eval_logits_frame(cfg, model_config) -> pd.DataFrame:
    """What the Trainer's evaluation keeps per rank for a recipe ``cfg`` (``TrainConfig``: ``eval_size`` rows,
    ``max_length`` tokens, ``per_device_eval_batch_size`` x ``nproc`` rows per step) and a model config (its
    ``vocab_size``): bf16 logits per step and for the whole evaluation, and the argmax ids instead (GiB,
    ``smolfsdp.gotchas.explained.gathered_logits_bytes``; at most: rows padded to ``max_length``)."""
    step_rows = cfg.per_device_eval_batch_size * cfg.nproc
    rows = [
        ("logits of one evaluation step (gathered from every rank)", step_rows, model_config.vocab_size, 2),
        ("logits of the whole evaluation", cfg.eval_size, model_config.vocab_size, 2),
        ("argmax ids of the whole evaluation (preprocess_logits_for_metrics)", cfg.eval_size, 1, 8),
    ]
    return pd.DataFrame(
        [
            {"held on every rank": what, "rows": n, "tokens per row": cfg.max_length,
             "GiB": gathered_logits_bytes(n, cfg.max_length, vocab, size) / 2**30}
            for what, n, vocab, size in rows
        ]
    )  # fmt: skip
