"""Chat messages -> tokens with assistant-only labels: the chat template, its pinned date, and the cut
of a long reasoning.

Used by ``smolfsdp.data.prepare`` (the fine-tune chapter, both engines). Every non-assistant token's
label is :data:`IGNORE_INDEX`; templates that call ``strftime_now`` render :data:`TEMPLATE_DATE`.

    python -c "from smolfsdp.data import chat; print(chat.build_messages('Q?', 'A.'))"
"""

from __future__ import annotations

import contextlib
import functools
import re
import signal
import threading
from datetime import datetime
from typing import Any

from smolfsdp.data.columns import row_fields
from smolfsdp.errors import ConfigError

IGNORE_INDEX = -100  # the label value torch.nn.CrossEntropyLoss (and HF's loss) skips

#: The date every chat template that calls ``strftime_now`` renders (SmolLM3's "Today Date: ..."; its
#: "Knowledge Cutoff Date" is June 2025): pinned so the tokens of a row are the same on every day.
TEMPLATE_DATE = datetime(2025, 6, 1)


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
#: Seconds one render of a two-turn conversation may take at the pre-launch check (SmolLM3's: ~1 ms).
TEMPLATE_TIME_LIMIT_S = 10.0


def check_chat_template(tokenizer, time_limit_s: float = TEMPLATE_TIME_LIMIT_S) -> None:
    """The tokenizer has a chat template, and it renders a two-turn conversation once, in Jinja's sandbox
    (transformers renders templates in an ``ImmutableSandboxedEnvironment``), within ``time_limit_s``.

    A template is code that ships with a tokenizer: one that escapes the sandbox, fails, or loops for hours
    (two nested ``range(100000)``) is refused here, before any row is tokenized. The time bound is a
    ``SIGALRM`` timer, so it holds in the main thread (the launcher, each rank); elsewhere the render is
    not bounded.

    Raises:
        ConfigError: no template, or one that fails, breaks the sandbox or runs too long; one line naming
            the tokenizer's files and the fix.
    """
    require_template(tokenizer)
    where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    fix = "use a tokenizer whose template renders plain text (the model's own, or the bundled data/tokenizer)"
    try:
        with _time_limit(time_limit_s):
            render_ids(build_messages("Is this a test?", "Yes."), tokenizer)
    except TimeoutError as err:
        raise ConfigError(
            f"The chat template of {where!r} (tokenizer_config.json or chat_template.jinja) did not render a "
            f"two-turn conversation within {time_limit_s:g} s (a loop without bound?); {fix}."
        ) from err
    except ConfigError:
        raise
    except Exception as err:  # jinja2's SecurityError, TemplateError, or whatever the template raises
        said = " ".join(str(err).split())[:200]
        raise ConfigError(
            f"The chat template of {where!r} (tokenizer_config.json or chat_template.jinja) failed to render "
            f"({type(err).__name__}: {said}); nothing was run outside Jinja's sandbox. {fix[0].upper()}{fix[1:]}."
        ) from err


def require_template(tokenizer) -> None:
    """Raise ConfigError when the tokenizer has no chat template (the per-row check; no render)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"The tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, so chat messages "
            "cannot be turned into tokens. Use a tokenizer that ships one (the model's own, or the bundled "
            "data/tokenizer), or set tokenizer.chat_template before training."
        )


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise TimeoutError in the block after ``seconds`` (SIGALRM; main thread only, else no bound)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
    (:func:`pin_template_date`).

    The whole conversation is tokenized uncut (``verbose=False``): a row longer than the tokenizer's
    ``model_max_length`` would otherwise make transformers 5.24 log "Token indices sequence length is longer
    than the specified maximum ... will result in indexing errors" (once per tokenizer, so once per rank and
    once in the launcher), although such a row never reaches the model: ``smolfsdp.data.prepare`` drops or
    cuts it at ``max_length`` and logs how many."""
    template = pin_template_date(tokenizer.get_chat_template())
    return tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=True,
        return_dict=True,
        tokenizer_kwargs={"verbose": False},
        **kwargs,
    )


def encode_chat(messages: list[dict[str, str]], tokenizer) -> tuple[list[int], list[int]]:
    """The whole conversation's token ids and its assistant mask (1 = an assistant token), uncut.

    Uses the template's ``{% generation %}`` markers (``return_assistant_tokens_mask``) when it has
    them; otherwise masks the prompt rendered with ``add_generation_prompt=True`` (it must be a prefix
    of the full conversation, which is checked).
    """
    require_template(tokenizer)
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
    r_ids = tokenizer(reasoning, add_special_tokens=False, verbose=False)["input_ids"]  # see render_ids
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
