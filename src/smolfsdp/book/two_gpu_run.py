"""The real run on two GPUs, before and after: expected memory and time, and what to check in ``summary.json``.

Chapter "The full fine-tune" (``notebooks/01_finetune.ipynb``, section "Running it on two GPUs") prints these
for the book's recipe (``configs/runs/smollm3_3b_medical.yaml``). Every number comes from the functions the
other pages use: the peak per GPU from ``smolfsdp.estimate.recipe_peak.recipe_peak`` and the verdict from
``smolfsdp.estimate.hardware.fit_verdict`` on the card the book's projections assume
(``smolfsdp.book.scaling_views.book_assumptions``); the step time, the MFU and the epoch from
``smolfsdp.estimate.time_model.plan_time``, the one time model that ``smolfsdp memory --config`` prints. :data:`SUMMARY_CHECKS` names the keys of
``summary.json`` to read once the run is done; ``tests/test_trl_fsdp.py`` holds each to a real run's file.

    python -c "from smolfsdp.book.two_gpu_run import expectations_markdown as m; print(m())"
"""

from __future__ import annotations

from typing import Any

from smolfsdp.book.scaling_views import book_assumptions, recipe_run
from smolfsdp.config import load_config
from smolfsdp.estimate.hardware import fit_verdict, get_gpu
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.estimate.recipe_peak import BOOK_RECIPE, MOMENT_TEXT, recipe_peak
from smolfsdp.estimate.time_model import duration, plan_time
from smolfsdp.paths import recipe, repo_root

GIB = 2**30
#: the libraries whose pinned versions a run records (``summary.json``'s ``versions``)
PINNED = ("torch", "transformers", "trl", "peft", "accelerate")

#: What to read in ``summary.json`` after the real run: (key path, what it should say). ``{...}`` fields are
#: filled by :func:`summary_checks_markdown` from the recipe and the estimates.
SUMMARY_CHECKS: tuple[tuple[str, str], ...] = (
    ("requested.strategy", "`fsdp1`: what the recipe asked for"),
    (
        "effective.strategy",
        "`fsdp1` too, read from the model the Trainer built; `ddp` or `none` means nothing was sharded, and "
        "`effective.reason` says why",
    ),
    ("effective.evidence.sharding_strategy", "`FULL_SHARD`"),
    ("effective.evidence.fsdp_units", "{units}: one unit per decoder layer ({layers}) and the root"),
    (
        "params.fraction_per_rank",
        "{fraction} on each of the {n} ranks: each GPU holds its share of the parameters",
    ),
    (
        "peak_memory_per_rank",
        "per GPU, `max_memory_allocated_bytes` near the {tensors} GiB tensor peak above and "
        "`max_memory_reserved_bytes` within the card's {card} GiB",
    ),
    ("versions", "{versions}, the pins of `constraints.txt` (the gotchas are version-specific)"),
)


def lookup(summary: dict, path: str) -> Any:
    """The value at a dotted key path of a summary (``"effective.evidence.fsdp_units"``); KeyError naming
    the first missing key."""
    value = summary
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(f"summary.json has no {path!r} (missing {key!r})")
        value = value[key]
    return value


def expected_memory(recipe_name: str = BOOK_RECIPE, gpu: str | None = None) -> dict[str, Any]:
    """The recipe's memory per GPU, as every page states it: ``tensors`` (:class:`RecipePeak`, tensors only, the
    dry run's number), ``device`` (the same with the CUDA context and NCCL buffers), ``need_gib`` (what
    ``verdict`` compares with the card: the caching allocator's reserved memory and both allowances),
    ``gpu`` (the card, default the one ``book_assumptions`` assumes), ``fit`` (``fit_verdict`` on it: the word
    and the numbers it rests on, as every page prints them) and ``verdict`` (its word)."""
    card = get_gpu(gpu or book_assumptions(recipe_name)["gpu"])
    tensors = recipe_peak(recipe_name)
    return {
        "tensors": tensors,
        "device": recipe_peak(recipe_name, include="device"),
        "need_gib": tensors.estimate.device_need_bytes / GIB,
        "gpu": card,
        "fit": (fit := fit_verdict(tensors.estimate, card)),
        "verdict": fit.word,
    }


def expected_time(recipe_name: str = BOOK_RECIPE) -> dict[str, Any]:
    """Estimated seconds per optimizer step and per epoch of the recipe on its ``nproc`` GPUs of the card
    ``book_assumptions`` assumes: ``plan_time`` (``smolfsdp.estimate.time_model``), what ``smolfsdp memory --config``
    prints for the recipe and that card (the seed's rows batched as the recipe batches them:
    ``time_model.data_tokens``). Keys: ``cfg``, ``plan`` (the ``TimePlan``), ``step`` (``estimate_step``'s numbers), ``steps`` (per epoch),
    ``rows_per_step``, ``epoch_s``, ``mfu_text`` (the MFU and its source), ``gpu``."""
    cfg = load_config(recipe(recipe_name))
    plan = plan_time(cfg, book_assumptions(recipe_name)["gpu"])
    return {
        "cfg": cfg,
        "plan": plan,
        "step": plan.step,
        "steps": plan.steps_per_epoch,
        "rows_per_step": plan.rows_per_step,
        "epoch_s": plan.epoch_s,
        "mfu_text": plan.mfu_source,
        "gpu": plan.gpu,
    }


def expectations_markdown(recipe_name: str = BOOK_RECIPE) -> str:
    """Two paragraphs: the memory per GPU with its verdict on the assumed card, then the time per step and
    per epoch, each number with what it counts and where it comes from."""
    m, t = expected_memory(recipe_name), expected_time(recipe_name)
    cfg, step, card = t["cfg"], t["step"], m["gpu"]
    tensors = m["tensors"]
    memory = (
        f"**Memory per GPU** (estimated: `recipe_peak`, the number every page quotes for this recipe). Each GPU "
        f"holds at most **{tensors.gib:.1f} GiB of tensors**, at {MOMENT_TEXT[tensors.moment]}; "
        f"{m['device'].gib:.1f} GiB with the CUDA context and NCCL buffers; **{m['need_gib']:.1f} GiB** with what "
        f"PyTorch's caching allocator keeps reserved, the number to hold against a card. On an {card.name} "
        f"({card.memory_gb:g} GB) the one fit verdict every page and `smolfsdp memory` print reads **{m['fit'].line}**. "
        f"Settings: {tensors.settings_line}."
    )
    plan = t["plan"]
    time = (
        f"**Time** (estimated: `plan_time`, the time model `smolfsdp memory --config` prints; not measured). One "
        f"optimizer step, {step['tokens_per_gpu']:,} tokens per GPU (micro-batch {cfg.per_device_train_batch_size} x "
        f"{step['tokens_per_gpu'] // (cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps):,} tokens x "
        f"{cfg.gradient_accumulation_steps} micro-batches), takes about "
        f"**{duration(plan.step_s)}** on {cfg.nproc} x {t['gpu']} ({plan.tokens_per_s_per_gpu:,.0f} real tokens/s per "
        f"GPU; {plan.token_text}), so the epoch, {t['steps']:,} steps "
        f"({plan.epoch_rows:,} training rows: {plan.rows_source}; {t['rows_per_step']} "
        f"{'packed ' if cfg.packing else ''}rows per step), takes about **{duration(plan.epoch_s)}**; evaluation "
        f"every {cfg.eval_steps} steps and the checkpoint writes come on top. "
        f"Assumed: {t['mfu_text']}."
    )
    return memory + "\n\n" + time


def pinned_versions(packages=PINNED) -> dict[str, str]:
    """``{package: version}`` from the repository's ``constraints.txt`` (``name==version`` lines)."""
    pins = {}
    for line in (repo_root() / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and name.strip().lower() in packages:
            pins[name.strip().lower()] = version.strip()
    return {p: pins[p] for p in packages if p in pins}


def summary_checks_markdown(recipe_name: str = BOOK_RECIPE) -> str:
    """:data:`SUMMARY_CHECKS` as a Markdown list, the expected values filled from the recipe (its model's
    decoder layers, its ranks), the estimates (:func:`expected_memory`) and ``constraints.txt``."""
    cfg = load_config(recipe(recipe_name))
    layers = resolve_model_config(recipe_run(cfg)["model"]).num_hidden_layers
    m = expected_memory(recipe_name)
    fields = {
        "units": layers + 1,
        "layers": layers,
        "fraction": f"{1 / cfg.nproc:.1f}",
        "n": cfg.nproc,
        "tensors": f"{m['tensors'].gib:.1f}",
        "card": f"{m['gpu'].memory_bytes / GIB:.1f}",
        "versions": ", ".join(f"{p} {v}" for p, v in pinned_versions().items()),
    }
    return "\n".join(f"- `{path}`: {what.format(**fields)}" for path, what in SUMMARY_CHECKS)
