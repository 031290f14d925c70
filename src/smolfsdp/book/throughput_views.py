"""How fast the real run goes, next to what it holds: padding, packing, checkpointing cost and MFU.

Chapter "The full fine-tune" (``notebooks/01_finetune.ipynb``, section "How fast it runs") shows these for the
book's recipe (``configs/runs/smollm3_3b_medical.yaml``), and ``scripts/token_efficiency.py`` prints the same
numbers. Every number comes from a function other pages use: real-token shares from
``smolfsdp.estimate.token_share`` on two length distributions (the bundled sample as ``smolfsdp.data.prepare``
tokenises it, and the seed-like distribution of ``smolfsdp.estimate.seed_lengths``); recomputation from
``smolfsdp.estimate.recompute``; step time and tokens/s from ``smolfsdp.estimate.scaling.estimate_step``; memory
from ``smolfsdp.estimate.recipe_peak`` and ``fit_verdict``; the MFU from ``smolfsdp.estimate.calibration``.
All of it is estimated; nothing here was timed.

    python -c "from smolfsdp.book.throughput_views import efficiency_table as t; print(t())"
"""

from __future__ import annotations

import functools

import pandas as pd

from smolfsdp.book.scaling_views import book_assumptions, recipe_run
from smolfsdp.config import load_config
from smolfsdp.data.columns import resolve_mapping, row_fields
from smolfsdp.data.files import load_rows
from smolfsdp.data.prepare import prepare_data
from smolfsdp.estimate.calibration import hfu_calibration, run_mfu
from smolfsdp.estimate.hardware import fit_verdict, get_gpu
from smolfsdp.estimate.recipe_peak import BOOK_RECIPE, recipe_peak
from smolfsdp.estimate.recompute import recompute_share
from smolfsdp.estimate.scaling import estimate_step
from smolfsdp.estimate.seed_lengths import SEED_LENGTHS_PATH, load_seed_lengths, seed_like_lengths
from smolfsdp.estimate.time_model import data_tokens
from smolfsdp.estimate.token_share import pack_lengths, padded_share, steps_per_epoch
from smolfsdp.models.modeling import load_tokenizer
from smolfsdp.paths import recipe

#: the micro-batches the recipes use (3B: 2; smoke: 4) and one row alone
MICRO_BATCHES = (1, 2, 4)
#: the recipe's max_length and twice it
PACK_LENGTHS = (2048, 4096)
BUNDLED = "bundled sample"
SEED_LIKE = "seed-like (derived)"


def bundled_config(recipe_name: str = BOOK_RECIPE, max_length: int | None = None):
    """The recipe's data settings on the bundled sample with the bundled tokenizer (``model: tiny``): its
    ``max_length`` (or ``max_length``), reasoning as the recipe says, every row in the training split
    (``eval_size: 0``: the recipe holds out 200 rows, more than the 180 bundled)."""
    overrides = {
        "model": "tiny",
        "dataset": "bundled",
        "eval_size": 0,
        "packing": False,
    }  # lengths of rows, unpacked
    if max_length is not None:
        overrides["max_length"] = max_length
    return load_config(recipe(recipe_name), **overrides)


@functools.cache
def bundled_lengths(recipe_name: str = BOOK_RECIPE, max_length: int | None = None) -> tuple[int, ...]:
    """Tokens per training row of the bundled sample as ``smolfsdp.data.prepare.prepare_data`` makes them under
    :func:`bundled_config` (the package's own tokenisation: chat template, reasoning, the too-long rule)."""
    cfg = bundled_config(recipe_name, max_length)
    data = prepare_data(cfg, load_tokenizer(cfg.model, cfg.tokenizer))
    return tuple(len(ids) for ids in data.train["input_ids"])


def bundled_chars_per_token(recipe_name: str = BOOK_RECIPE) -> dict:
    """Characters per token of the bundled tokenizer on the bundled rows' three fields (question, reasoning,
    response; each tokenised alone, no special tokens): ``{"tokenizer", "rows", "chars", "tokens",
    "chars_per_token", "mean_row_tokens"}`` (the last: rows as :func:`bundled_lengths` makes them)."""
    cfg = bundled_config(recipe_name)
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer)
    rows = load_rows(cfg.dataset)
    _, mapping = resolve_mapping(rows.column_names, cfg.columns)
    fields = [text for i, row in enumerate(rows) for text in row_fields(row, mapping, i) if text]
    chars = sum(map(len, fields))
    tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in fields)
    lengths = bundled_lengths(recipe_name)
    return {
        "tokenizer": f"data/tokenizer (the bundled byte-level BPE, {len(tokenizer):,} tokens)",
        "rows": len(rows),
        "chars": chars,
        "tokens": tokens,
        "chars_per_token": round(chars / tokens, 3),
        "mean_row_tokens": round(sum(lengths) / len(lengths), 1),
    }


def seed_training_lengths(recipe_name: str = BOOK_RECIPE, max_length: int | None = None) -> list[int]:
    """The seed-like rows (``seed_like_lengths``, central scenario) less the recipe's ``eval_size`` held out:
    the training split the real run would pack or pad."""
    cfg = load_config(recipe(recipe_name))
    lengths = seed_like_lengths(max_length or cfg.max_length)
    return lengths[: len(lengths) - int(cfg.eval_size)]


def distributions(recipe_name: str = BOOK_RECIPE, max_length: int | None = None) -> dict[str, list[int]]:
    """``{name: training row lengths}`` for :data:`BUNDLED` and :data:`SEED_LIKE`, prepared at ``max_length``
    (default the recipe's)."""
    return {
        BUNDLED: list(bundled_lengths(recipe_name, max_length)),
        SEED_LIKE: seed_training_lengths(recipe_name, max_length),
    }


def efficiency(lengths_by_length: dict[int, list[int]], cfg, seed: int = 0) -> dict:
    """The token-efficiency numbers of one distribution: ``lengths_by_length`` maps each of
    :data:`PACK_LENGTHS` to the rows prepared at that ``max_length`` (the first is the recipe's).

    Keys: ``rows``, ``real_tokens``, ``padded_share_mb{k}`` for :data:`MICRO_BATCHES` (shuffled by ``seed``),
    ``packed_share_{n}`` and ``packed_rows_{n}`` per pack length (TRL's BFD), ``steps_padded`` and
    ``steps_packed`` (one epoch at the recipe's ``nproc x micro-batch x gradient_accumulation_steps``, rows or
    packed rows at the recipe's ``max_length``)."""
    base = lengths_by_length[PACK_LENGTHS[0]]
    out: dict = {"rows": len(base), "real_tokens": sum(base)}
    for k in MICRO_BATCHES:
        out[f"padded_share_mb{k}"] = padded_share(base, k, seed)
    for n in PACK_LENGTHS:
        bins = pack_lengths(lengths_by_length[n], n)
        out[f"packed_share_{n}"] = sum(map(sum, bins)) / (len(bins) * n)
        out[f"packed_rows_{n}"] = len(bins)
    batch = dict(
        n_gpus=cfg.nproc,
        micro_batch=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
    )
    out["steps_padded"] = steps_per_epoch(len(base), **batch)
    out["steps_packed"] = steps_per_epoch(out[f"packed_rows_{PACK_LENGTHS[0]}"], **batch)
    return out


@functools.cache
def efficiency_numbers(recipe_name: str = BOOK_RECIPE) -> dict[str, dict]:
    """:func:`efficiency` of both :func:`distributions` under the recipe (its seed orders the padded rows)."""
    cfg = load_config(recipe(recipe_name))
    by_length = {n: distributions(recipe_name, n) for n in PACK_LENGTHS}
    return {
        name: efficiency({n: by_length[n][name] for n in PACK_LENGTHS}, cfg, cfg.seed)
        for name in by_length[2048]
    }


def efficiency_table(recipe_name: str = BOOK_RECIPE) -> pd.DataFrame:
    """One row per distribution: the real-token share (%) padded per micro-batch and packed per length, and
    the packed rows at the recipe's length; the numbers of :func:`efficiency_numbers`."""
    rows = {}
    for name, e in efficiency_numbers(recipe_name).items():
        row = {f"padded, micro-batch {k} (%)": 100 * e[f"padded_share_mb{k}"] for k in MICRO_BATCHES}
        row |= {f"packed to {n:,} (%)": 100 * e[f"packed_share_{n}"] for n in PACK_LENGTHS}
        row[f"rows -> packed rows at {PACK_LENGTHS[0]:,}"] = (
            f"{e['rows']:,} -> {e[f'packed_rows_{PACK_LENGTHS[0]}']:,}"
        )
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("row lengths")


def efficiency_markdown(recipe_name: str = BOOK_RECIPE) -> str:
    """The sentence under the table: the seed-like padding at the recipe's micro-batch, the packed fill, and
    the optimizer steps of an epoch each way."""
    cfg = load_config(recipe(recipe_name))
    e = efficiency_numbers(recipe_name)[SEED_LIKE]
    k, n = cfg.per_device_train_batch_size, PACK_LENGTHS[0]
    seed = load_seed_lengths()
    return (
        f"At the recipe's micro-batch of {k}, {100 * (1 - e[f'padded_share_mb{k}']):.0f} % of the tokens a padded "
        f"step computes on seed-like rows are padding; TRL's BFD fills packed rows of {n:,} tokens to "
        f"{100 * e[f'packed_share_{n}']:.0f} %, and its padding-free collator computes none of the rest. An epoch "
        f"of the {e['rows']:,} seed-like training rows takes {e['steps_padded']:,} optimizer steps of "
        f"{cfg.nproc} GPUs x {k} rows x {cfg.gradient_accumulation_steps} padded, or {e['steps_packed']:,} steps "
        f"of as many packed rows. The seed-like rows are derived, not measured ({seed['rows']:,} rows; "
        f"`{SEED_LENGTHS_PATH}` states every source and assumption)."
    )


def checkpointing_cost(recipe_name: str = BOOK_RECIPE, gpu: str = "H100 SXM") -> dict[str, dict]:
    """The recipe with full activation checkpointing (``"full"``) and without (``"none"``) on ``nproc`` x
    ``gpu``: ``recompute`` (``recompute_share``; none: 0), ``mfu`` (``run_mfu``), ``step`` (``estimate_step`` at
    the recipe's sequence, micro-batch and accumulation, the card and network of ``book_assumptions``),
    ``peak`` (``recipe_peak``) and ``fit`` (``fit_verdict`` on the card)."""
    cfg = load_config(recipe(recipe_name))
    a = book_assumptions(recipe_name, gpu=gpu)
    run = recipe_run(cfg)
    keys = ("gpu", "gpus_per_node", "network", "seq_len", "micro_batch", "gradient_accumulation_steps")
    out = {}
    for mode, ac in (("full", True), ("none", False)):
        peak = recipe_peak(recipe_name, activation_checkpointing=ac)
        out[mode] = {
            "recompute": recompute_share(run["model"], "full", seq_len=cfg.max_length) if ac else None,
            "mfu": run_mfu(gpu, run["model"], seq_len=cfg.max_length, ac_mode="full" if ac else None),
            "step": estimate_step(
                run["model"],
                strategy=cfg.sharding_strategy,
                n_gpus=cfg.nproc,
                fsdp_version=cfg.fsdp_version,
                activation_checkpointing=ac,
                **{k: a[k] for k in keys},
            ),
            "peak": peak,
            "fit": fit_verdict(peak.estimate, get_gpu(gpu)),
        }
    return out


def checkpointing_table(recipe_name: str = BOOK_RECIPE, gpu: str = "H100 SXM") -> pd.DataFrame:
    """:func:`checkpointing_cost` as a table: memory need, recomputed FLOPs, MFU, step time, tokens/s per GPU,
    and real tokens/s per GPU (tokens/s x the real share of the seed-like rows as the recipe batches them:
    ``time_model.data_tokens``, the packed fill when it packs, else the padded share at its micro-batch)."""
    cfg = load_config(recipe(recipe_name))
    share = data_tokens(cfg).share
    rows = {}
    for mode, c in checkpointing_cost(recipe_name, gpu).items():
        rows[f"checkpointing {mode}"] = {
            "needs (GiB reserved)": c["peak"].estimate.device_need_bytes / 2**30,
            "recomputed (% of step FLOPs)": 100 * c["recompute"]["of_step"] if c["recompute"] else 0.0,
            "MFU (%)": 100 * c["mfu"]["mfu"],
            "step (s)": float(c["step"]["step_s"]),
            "tokens/s per GPU": float(c["step"]["tokens_per_s_per_gpu"]),
            "real tokens/s per GPU": float(c["step"]["tokens_per_s_per_gpu"]) * share,
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(f"{cfg.nproc} x {gpu}")


def checkpointing_markdown(recipe_name: str = BOOK_RECIPE, gpu: str = "H100 SXM") -> str:
    """The sentence under the checkpointing table: recomputed share of a forward, the speed-up without it, and
    the fit verdict both ways."""
    c = checkpointing_cost(recipe_name, gpu)
    full, none = c["full"], c["none"]
    gain = none["step"]["tokens_per_s_per_gpu"] / full["step"]["tokens_per_s_per_gpu"] - 1
    return (
        f"Full checkpointing recomputes {100 * full['recompute']['of_forward']:.0f} % of the decoder layers' forward "
        f"FLOPs in backward (not 100 %: torch stops before the last matmul; `smolfsdp.estimate.recompute`), "
        f"+{100 * full['recompute']['of_step']:.0f} % FLOPs per step. Without it the estimate gives "
        f"**+{100 * gain:.0f} % tokens/s** per GPU, and memory still fits: with it **{full['fit'].line}**; without "
        f"it **{none['fit'].line}**. Estimated, not measured."
    )


def mfu_markdown(recipe_name: str = BOOK_RECIPE, gpu: str = "H100 SXM") -> str:
    """What MFU counts, the calibrated rate the estimates use and its source, and the run's MFU each way."""
    cfg = load_config(recipe(recipe_name))
    run = recipe_run(cfg)
    hfu = hfu_calibration(gpu)
    with_ac = run_mfu(gpu, run["model"], seq_len=cfg.max_length, ac_mode="full")
    without = run_mfu(gpu, run["model"], seq_len=cfg.max_length, ac_mode=None)
    return (
        f"The estimates assume the GPU runs at **{100 * hfu['hfu']:.1f} % hardware FLOP utilisation** (HFU: every "
        f"FLOP it does, recomputation included). Source: {hfu['text']}. A run's MFU counts only the model's FLOPs: "
        f"with full checkpointing that is "
        f"**{100 * with_ac['mfu']:.1f} %**, without it **{100 * without['mfu']:.1f} %** "
        f"(`smolfsdp.estimate.calibration.run_mfu`)."
    )
