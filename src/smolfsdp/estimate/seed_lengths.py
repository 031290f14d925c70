"""Row lengths like the seed's data set, derived from what is published about it (no Hub access here).

The real run tokenises ``FreedomIntelligence/medical-o1-reasoning-SFT`` (config ``en``) with SmolLM3's tokenizer
and chat template, reasoning included (``configs/runs/smollm3_3b_medical.yaml``). Neither the data set nor that
tokenizer can be downloaded on this project's machines, and no published table of its token lengths was found,
so this module derives a distribution from published pieces (:data:`PUBLISHED`, each with its source) and states
what it assumes (:data:`ASSUMED`). ``scripts/seed_lengths.py`` writes the result to :data:`SEED_LENGTHS_PATH`
with its provenance; ``tests/test_token_share.py`` holds the committed file equal to :func:`derive_seed_lengths`.

The model of one row (characters become tokens at ``chars_per_token``; SmolLM3's template adds a fixed part):

* question characters ~ lognormal(``question_mu``, ``question_sigma``), fitted to the published histogram;
* answer characters (reasoning + response) ~ lognormal(``answer_mu``, ``answer_sigma``), independent of the
  question, its mean what the published file size leaves after the questions; the response is ``1 -
  cot_share`` of it;
* tokens = ``template_tokens + (question + answer) / chars_per_token``; a row over ``max_length`` has its
  reasoning cut to fit (``smolfsdp.data.prepare``'s rule), so it counts ``max_length``; one whose question and
  response alone do not fit is dropped.

Chapter "The full fine-tune" (section "How fast it runs") and ``scripts/token_efficiency.py`` use it.

    python -c "from smolfsdp.estimate.seed_lengths import seed_like_lengths as s; print(len(s()))"
"""

from __future__ import annotations

import functools
import json
import math

from smolfsdp.errors import ConfigError
from smolfsdp.paths import repo_root

SEED_LENGTHS_PATH = "data/results/published/seed_lengths.json"
DATASET = "FreedomIntelligence/medical-o1-reasoning-SFT"
HUB = f"https://huggingface.co/datasets/{DATASET}"

#: What was found published, with where. Character counts are of the raw strings.
PUBLISHED: dict = {
    "question_histogram": {
        "edges_chars": list(range(50, 750, 50)),
        "counts": [173, 1481, 4235, 4270, 3655, 2808, 2081, 1598, 1068, 733, 521, 365, 313, 266, 1804],
        "rows": 25_371,
        "what": "rows per 50-character bin of len(Question) (the last bin: 700 or more), and len(data) = 25,371, "
        "printed by a public GitHub script run on the data set's medical_o1_sft.json",
        "source": "GitHub code index (the search tool's code corpus), stored file id 27703031890 (the index does "
        f"not name its repository); the script cites {HUB}",
    },
    "file_sizes_bytes": {
        "first_release_medical_o1_sft_json": 75e6,
        "en_medical_o1_sft_json": 58.2e6,
        "source": f"{HUB}/tree/704e1f51cd3136ce2f9c9c66e7fdb6d59332ef66 (one English file, 75 MB) and "
        f"{HUB}/tree/main (the en config's medical_o1_sft.json, 58.2 MB)",
    },
    "row_zero_chars": {
        "question": 267,
        "complex_cot": 1_503,
        "response": 741,
        "source": "the en config's first row, printed with its total length by a public format-check report "
        "(code index, stored file id 53859488139); the same row is TRL's documentation example",
    },
    "template": {
        "render_chars": 1_369,
        "question_chars": 12,
        "date": "04 September 2026",
        "special_tokens": 4,
        "what": "SmolLM3-3B's apply_chat_template of one 12-character user turn in reasoning mode (its default "
        "system block and metadata, with the generation prompt): 1,369 characters, 3 <|im_start|> and 1 "
        "<|im_end|>",
        "source": "upstream rendering at revision a07cc9a0 quoted byte for byte by a public test (code index, "
        "stored file id 58561414986)",
    },
    "chars_per_token": {
        "value": 4.0,
        "source": "https://learn.deeplearning.ai/courses/introducing-multimodal-llama-3-2/lesson/6/tokenization: "
        "the Llama 3 tokenizer (128K vocabulary) takes English from roughly 3.2 to 4 characters per token; "
        "SmolLM3's vocabulary is Llama 3's 128,256 (data/models/smollm3_3b/config.json)",
    },
}

#: What had to be assumed, per scenario: central, and the two ends of the range printed beside it.
ASSUMED: dict = {
    "json_overhead_bytes": {"central": 100, "narrow": 100, "wide": 100},
    "answer_sigma": {"central": 0.35, "narrow": 0.25, "wide": 0.45},
    "chars_per_token": {"central": 4.0, "narrow": 4.4, "wide": 3.6},
    "why": {
        "json_overhead_bytes": "keys, indentation and escaped newlines per row of the JSON file (not its text)",
        "answer_sigma": "spread of reasoning + response lengths: no published histogram; GPT-4o's traces vary "
        "about 3x between the 5th and 95th percentile at 0.35",
        "chars_per_token": "medical terms may split more than general English: 3.6-4.4 around the published 4.0",
        "cot_share": "the reasoning's share of reasoning + response, from the one published row (0.67)",
        "rows": "en rows = 25,371 x 58.2 MB / 75 MB (same bytes per row as the first release)",
        "independence": "question and answer lengths drawn independently",
    },
}

#: The date ``smolfsdp.data.chat`` pins in templates ("01 June 2025").
PINNED_DATE = "01 June 2025"
#: What ``smolfsdp.data.chat.build_messages`` adds around the reasoning, and the assistant turn's end.
THINK_WRAP_CHARS = len("<think>\n\n</think>\n") + len("\n")
EXTRA_SPECIAL_TOKENS = 1  # the assistant turn's <|im_end|>


def _normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def fit_lognormal(edges: list[float], counts: list[int]) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal whose bin probabilities best match ``counts`` (least squares on a 0.005
    grid; bins ``< edges[0]``, ``[edges[i], edges[i+1])`` ..., ``>= edges[-1]``)."""
    total = sum(counts)
    p = [c / total for c in counts]
    logs = [math.log(e) for e in edges]
    best = (math.inf, 0.0, 0.0)
    for i in range(401):
        mu = 4.0 + 0.005 * i
        for j in range(1, 241):
            s = 0.005 * j
            cdf = [0.0] + [_normal_cdf((x - mu) / s) for x in logs] + [1.0]
            err = sum((cdf[k + 1] - cdf[k] - p[k]) ** 2 for k in range(len(p)))
            if err < best[0]:
                best = (err, mu, s)
    return round(best[1], 3), round(best[2], 3)


def template_tokens(chars_per_token: float) -> float:
    """Tokens SmolLM3's template adds to every row: its fixed text (:data:`PUBLISHED` ``template`` less the
    question, with the pinned date, plus the think wrap) at ``chars_per_token``, and its special tokens."""
    t = PUBLISHED["template"]
    text = t["render_chars"] - t["question_chars"] - len(t["date"]) + len(PINNED_DATE)
    text += THINK_WRAP_CHARS - len("<|im_start|>") * 3 - len("<|im_end|>")
    return round(t["special_tokens"] + EXTRA_SPECIAL_TOKENS + text / chars_per_token, 1)


def _scenario(name: str, q_mu: float, q_sigma: float) -> dict:
    a = ASSUMED
    files = PUBLISHED["file_sizes_bytes"]
    per_row = files["first_release_medical_o1_sft_json"] / PUBLISHED["question_histogram"]["rows"]
    answer_mean = per_row - a["json_overhead_bytes"][name] - math.exp(q_mu + q_sigma**2 / 2)
    sigma = a["answer_sigma"][name]
    cpt = a["chars_per_token"][name]
    row = PUBLISHED["row_zero_chars"]
    return {
        "question_mu": q_mu,
        "question_sigma": q_sigma,
        "answer_mu": round(math.log(answer_mean) - sigma**2 / 2, 4),
        "answer_sigma": sigma,
        "cot_share": round(row["complex_cot"] / (row["complex_cot"] + row["response"]), 3),
        "chars_per_token": cpt,
        "template_tokens": template_tokens(cpt),
    }


def sample_lengths(params: dict, rows: int, max_length: int, seed: int = 0) -> list[int]:
    """Token lengths of ``rows`` rows drawn from one scenario's ``params`` (module docstring): reasoning cut
    at ``max_length``, rows whose question and response alone exceed it dropped. Seeded numpy draws."""
    import numpy as np  # deferred: numpy is only needed to draw

    rng = np.random.default_rng(seed)
    q = rng.lognormal(params["question_mu"], params["question_sigma"], rows)
    a = rng.lognormal(params["answer_mu"], params["answer_sigma"], rows)
    cpt, t0 = params["chars_per_token"], params["template_tokens"]
    total = np.rint(t0 + (q + a) / cpt)
    floor = t0 + (q + (1 - params["cot_share"]) * a) / cpt  # with the whole reasoning cut
    kept = floor <= max_length
    return [int(n) for n in np.minimum(total[kept], max_length)]


def _summary(lengths: list[int], max_length: int) -> dict:
    s = sorted(lengths)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {
        "rows": len(s),
        "mean_tokens": round(sum(s) / len(s), 1),
        "p10": pick(0.1),
        "median": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        f"share_cut_to_{max_length}": round(sum(n == max_length for n in s) / len(s), 4),
    }


def derive_seed_lengths(bundled: dict, packed_fill: dict | None = None) -> dict:
    """The content of :data:`SEED_LENGTHS_PATH`: rows, the three scenarios' parameters, a summary of each
    (seed 0, ``max_length`` 2,048), :data:`PUBLISHED`, :data:`ASSUMED`, and ``bundled`` (the bundled tokenizer's
    characters per token on the bundled rows, measured by ``scripts/seed_lengths.py``; recorded, not used) and
    ``packed_fill`` (``{max_length: real / slot tokens}`` of the central scenario packed by TRL's BFD,
    ``token_share.packed_share``, computed by the script so that the time model reads it without importing TRL)."""
    hist = PUBLISHED["question_histogram"]
    q_mu, q_sigma = fit_lognormal(hist["edges_chars"], hist["counts"])
    files = PUBLISHED["file_sizes_bytes"]
    rows = round(hist["rows"] * files["en_medical_o1_sft_json"] / files["first_release_medical_o1_sft_json"])
    scenarios = {name: _scenario(name, q_mu, q_sigma) for name in ("central", "narrow", "wide")}
    return {
        "what": f"token lengths of {DATASET} (en) rows as SmolLM3's tokenizer and chat template with reasoning "
        "would make them: a distribution derived from published pieces, not measured (smolfsdp.estimate.seed_lengths)",
        "rows": rows,
        "scenarios": scenarios,
        "summary_at_2048": {n: _summary(sample_lengths(p, rows, 2048), 2048) for n, p in scenarios.items()},
        "published": PUBLISHED,
        "assumed": ASSUMED,
        "bundled": bundled,
        **({"packed_fill": packed_fill} if packed_fill is not None else {}),
    }


@functools.cache
def load_seed_lengths() -> dict:
    """The committed :data:`SEED_LENGTHS_PATH`; ConfigError when it is missing (``python scripts/seed_lengths.py``
    writes it)."""
    path = repo_root() / SEED_LENGTHS_PATH
    if not path.is_file():
        raise ConfigError(
            f"{SEED_LENGTHS_PATH} is missing: run `python scripts/seed_lengths.py` to write it."
        )
    return json.loads(path.read_text())


def seed_like_lengths(max_length: int = 2048, scenario: str = "central", seed: int = 0) -> list[int]:
    """Token lengths of rows like the seed's (the committed file's ``rows`` and ``scenario``), prepared at
    ``max_length``. ConfigError for an unknown scenario."""
    data = load_seed_lengths()
    if scenario not in data["scenarios"]:
        raise ConfigError(f"scenario {scenario!r}: pick one of {', '.join(data['scenarios'])}.")
    return sample_lengths(data["scenarios"][scenario], data["rows"], max_length, seed)


def packed_fill(max_length: int) -> float | None:
    """The central scenario's packed fill at ``max_length`` (real tokens / packed slot tokens, TRL's BFD) as
    committed by ``scripts/seed_lengths.py``; None for a length it did not pack."""
    return load_seed_lengths().get("packed_fill", {}).get(str(max_length))
