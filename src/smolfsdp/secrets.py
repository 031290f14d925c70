"""Keep tokens and secrets out of every file a run writes for people: :func:`redact`.

Bottom layer: imports nothing of ours. The run writer, the checkpoint writer, the config writer and
the launcher's failure report all redact through here; the ranks themselves read the unredacted
config from a private temporary file (:func:`smolfsdp.launch.torchrun.launch`).

    >>> redact({"hub_token": "hf_abc", "lr": 1e-4})
    {'hub_token': '<redacted>', 'lr': 0.0001}
"""

from __future__ import annotations

import os
import re
from typing import Any

#: Names of environment variables and mapping keys whose values are secrets: HF_TOKEN, hub_token, GH_TOKEN,
#: AWS_SESSION_TOKEN, a bare TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ... A name is cut
#: into words at ``_``, ``-`` and ``.``; a last word ``TOKEN`` (:data:`TOKEN_NAME`) makes it secret unless the
#: word before it says it is a rate, a position or a special token (:data:`NOT_SECRET_TOKEN`). ``tokens``,
#: ``num_tokens`` and ``max_new_tokens`` (plural) never match.
SECRET_NAME = re.compile(
    r"SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|(^|[_.-])KEY$", re.I
)
#: The ``TOKEN`` rule, apart from :data:`SECRET_NAME` so that its exceptions never excuse a ``*PASSWORD*``.
TOKEN_NAME = re.compile(r"(^|[_.-])TOKEN$", re.I)
#: ``*_token`` names that are not secrets: rates and positions (``flops_per_token``, ``cost_per_token``,
#: ``time_to_first_token``) and tokenizer special tokens (``pad_token``, ``eos_token``,
#: ``chat_template_token``, ...). Deliberately a short list of exceptions rather than a list of secret
#: prefixes: an unknown ``*_TOKEN`` (``MY_SERVICE_TOKEN``) stays secret; a harmless key wrongly redacted
#: shows as ``<redacted>`` and is fixed by adding its word here, a leaked token cannot be taken back.
NOT_SECRET_TOKEN = re.compile(
    r"(^|[_.-])(per|first|last|next|pad|bos|eos|unk|sep|cls|mask|special|template|start|end|eot|image"
    r"|audio|video|tool|think)[_.-]token$",
    re.I,
)
#: Values that look like secrets wherever they appear (Hugging Face, OpenAI-style, GitHub, AWS access keys).
SECRET_VALUE = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}|\bgh[pousr]_[A-Za-z0-9]{36,}|\bAKIA[0-9A-Z]{16}\b"
)
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """True for names like ``HF_TOKEN``, ``hub_token``, ``TOKEN``, ``WANDB_API_KEY``, ``DB_PASSWORD``; False for
    ``tokens``, ``num_tokens``, ``flops_per_token``, ``pad_token``, ``chat_template_token``."""
    if SECRET_NAME.search(name):
        return True
    return bool(TOKEN_NAME.search(name)) and not NOT_SECRET_TOKEN.search(name)


def secret_values(env: dict[str, str] | None = None, min_len: int = 8) -> list[str]:
    """Values of environment variables whose names look secret (``HF_TOKEN``, ``WANDB_API_KEY``, ...), longest first."""
    env = os.environ if env is None else env
    vals = {v for k, v in env.items() if is_secret_name(k) and len(v) >= min_len}
    return sorted(vals, key=len, reverse=True)


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of ``obj`` (dicts, lists, strings, scalars) with secrets replaced by ``<redacted>``.

    A mapping key that looks secret has its value replaced; in every string the values of secret
    environment variables (:func:`secret_values`) and token-shaped substrings (:data:`SECRET_VALUE`) are
    replaced, also inside file paths (``/data/hf_medicalquestionanswers2024.jsonl`` becomes
    ``/data/<redacted>.jsonl``): safety first, so use it on what is written for people, never on the
    config the ranks train with (``TrainConfig.save(path, redact_secrets=False)`` in :func:`launch`).
    """
    secrets = secret_values() if secrets is None else secrets
    if isinstance(obj, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and is_secret_name(k) and v not in (None, "", False)
                else redact(v, secrets)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return type(obj)(redact(v, secrets) for v in obj)
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, REDACTED)
        return SECRET_VALUE.sub(REDACTED, obj)
    return obj


def redacted_keys(obj: Any, prefix: str = "") -> list[str]:
    """The keys of mapping ``obj`` (dotted inside nested mappings: ``extra.wandb_api_key``) whose value, or a
    string in its list, holds :data:`REDACTED`: what :func:`redact` replaced when the file was written, so
    the file no longer holds the value that ran. In the order found, each once."""
    if isinstance(obj, dict):
        found = [k for key, v in obj.items() for k in redacted_keys(v, f"{prefix}{key}.")]
    elif isinstance(obj, list | tuple):
        found = [k for v in obj for k in redacted_keys(v, prefix)]
    else:
        found = [prefix.rstrip(".")] if isinstance(obj, str) and REDACTED in obj else []
    return list(dict.fromkeys(found))
