"""Today's estimator against published GPU measurements (``data/results/published/rows.json``).

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``), section "Held to published
GPU runs"; ``scripts/published_check.py`` writes
the table to ``data/results/published/check.json`` and tests/test_published.py holds that file to today's
estimator. Each row names its source (repository, file, commit), its configuration and what its number is
(``reserved`` = peak ``torch.cuda.max_memory_reserved``, ``allocated`` = peak ``max_memory_allocated``,
``active`` = ``memory_stats()["active_bytes.all.peak"]``: allocated plus the blocks FSDP1's ``record_stream``
keeps busy past their frees, ``MemoryEstimate.record_stream_bytes``).
Rows the estimator cannot express yet (``"modelled": false``) keep their reason and get no error.

    python -c "from smolfsdp.audit.published_rows import check_table; print(check_table())"
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.hardware import GPUS, get_gpu, verdict
from smolfsdp.estimate.loss_path import LOSS_PATHS
from smolfsdp.estimate.memory import LORA_LAYOUTS, estimate_memory
from smolfsdp.estimate.params import LoraSpec, count_parameters, resolve_model_config
from smolfsdp.estimate.recipes import RECIPES, STRATEGIES
from smolfsdp.estimate.record_stream import fsdp1_stream_held, fsdp2_reduce_scatter_kept
from smolfsdp.estimate.reserved import reserved_parts, reserved_range_bytes
from smolfsdp.paths import repo_root

GIB = 2**30
ROWS_PATH = "data/results/published/rows.json"
CHECK_PATH = "data/results/published/check.json"
#: What "matches" means, from issue 31: reserved within 10 %, allocated / active within 5 %.
TOLERANCE_PCT = {"reserved": 10.0, "allocated": 5.0, "active": 5.0}


def load_rows(path: str | Path | None = None) -> dict:
    """The published rows file (``sources`` and ``rows``), every row checked (:func:`check_row`) before any is used.

    Raises:
        ConfigError: the file is missing, is not JSON (its line and column), has no rows, or a row is not what
            the estimator reads (its id and key named).
    """
    p = Path(path) if path else repo_root() / ROWS_PATH
    if not p.is_file():
        raise ConfigError(f"{p} not found; the published rows live in {ROWS_PATH}.")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{p} is not JSON (line {err.lineno}, column {err.colno}: {err.msg}).") from err
    if not isinstance(data, dict) or not data.get("rows") or not isinstance(data["rows"], list):
        raise ConfigError(f"{p} has no 'rows' (a list of row objects).")
    sources = data.get("sources") if isinstance(data.get("sources"), dict) else {}
    seen: set[str] = set()
    for i, row in enumerate(data["rows"], 1):
        rid = row.get("id") if isinstance(row, dict) else None
        named = f"row {rid!r}" if isinstance(rid, str) and rid else f"row {i}"
        problem = check_row(row, sources) or (
            f"{rid!r} is the id of an earlier row too" if rid in seen else None
        )
        if problem:
            raise ConfigError(f"{p}, {named}: {problem}; fix that row.")
        seen.add(rid)
    return data


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _names(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, str) and t for t in v)


def _positive(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


#: The checks of a row's keys: key -> (test, what the value must be). Names are checked against the
#: estimator's own lists, so a misspelt one is refused here, not as a traceback or another tool's advice.
ROW_KEYS = {
    "world_size": (_whole, "a whole number >= 1"), "seq_len": (_whole, "a whole number >= 1"),
    "micro_batch": (_whole, "a whole number >= 1"), "ac_every": (_whole, "a whole number >= 1"),
    "gpu_memory_gib": (_positive, "a positive number"), "fsdp_version": (lambda v: v in (1, 2), "1 or 2"),
    "activation_checkpointing": (lambda v: isinstance(v, bool), "true or false"),
    "offload": (lambda v: isinstance(v, bool), "true or false"),
    "modelled": (lambda v: isinstance(v, bool), "true or false"),
}  # fmt: skip
ROW_NAMES = {
    "outcome": ("ran", "out of memory"), "recipe": tuple(RECIPES), "strategy": STRATEGIES, "gpu": tuple(GPUS),
    "loss_path": tuple(LOSS_PATHS), "ac_mode": ("full", "layer", "op"), "layout": LORA_LAYOUTS,
}  # fmt: skip
MEASURED = ("reserved_gib", "allocated_gib", "active_gib", "tokens_per_s_per_gpu", "mfu_pct")


def check_row(row, sources: dict) -> str | None:
    """What is wrong with one published row, in words naming the key, or None: the keys every row has, their
    types (:data:`ROW_KEYS`, ``measured`` values positive numbers of :data:`MEASURED`), names the estimator knows
    (:data:`ROW_NAMES`, ``source`` one of the file's sources), a model folder with ``config.json`` in the
    repository for a ``data/`` model or a tokens/s row with its GPU (:func:`mfu_rows` reads those); a modelled
    memory row also needs its strategy, FSDP version and GPU memory, a LoRA row ``r``, ``alpha`` and ``targets``."""
    if not isinstance(row, dict):
        return f"is a {type(row).__name__}, not an object"
    needed = ["id", "source", "model", "world_size", "seq_len", "micro_batch", "outcome", "measured"]
    if missing := [k for k in needed if k not in row]:
        return f"{missing[0]!r} is missing"
    measured, lora = row["measured"], row.get("lora")
    if not isinstance(row["id"], str) or not row["id"]:
        return f"id must be a non-empty string, not {row['id']!r}"
    if not isinstance(measured, dict) or not measured:
        return f"measured must be an object of published numbers, not {measured!r}"
    if lora is not None and not isinstance(lora, dict):
        return f"lora must be an object (r, alpha, targets), not {lora!r}"
    if row.get("modelled", True) and "recipe" in row and any(k.endswith("_gib") for k in measured):
        needed += ["strategy", "fsdp_version", "gpu_memory_gib"]
    # a LoRA row's own keys are listed only when missing
    needed += [f"lora.{k}" for k in ("r", "alpha", "targets") if lora and k not in lora]
    if missing := [k for k in needed if k.startswith("lora.") or k not in row]:
        return f"{missing[0]!r} is missing"
    checks = [(k, row[k], *ROW_KEYS[k]) for k in ROW_KEYS if k in row]
    checks += [(f"measured.{k}", v, _positive, "a positive number") for k, v in measured.items()]
    checks += [(f"lora.{k}", lora[k], _whole, "a whole number >= 1") for k in ("r", "alpha") if lora]
    if lora:
        checks.append(("lora.targets", lora["targets"], _names, "a list of module names"))
    for key, value, test, what in checks:
        if not test(value):
            return f"{key} must be {what}, not {value!r}"
    names = [(k, row[k], ROW_NAMES[k]) for k in ROW_NAMES if k in row]
    names += [("measured key", k, MEASURED) for k in measured] + [("source", row["source"], tuple(sources))]
    for key, value, known in names:
        if value not in known:
            return f"{key} {value!r} is not one of {list(known)}"
    local = str(row["model"]).startswith("data/") or {"tokens_per_s_per_gpu", "gpu"} <= {*measured, *row}
    if local and not (repo_root() / str(row["model"]) / "config.json").is_file():
        return f"model {row['model']!r} has no config.json in the repository (a folder under data/models/)"
    return None


def estimate_row(row: dict):
    """The ``MemoryEstimate`` for a modelled memory row (its model path is relative to the repository)."""
    lora = row.get("lora")
    spec = None
    if lora:
        spec = LoraSpec(r=lora["r"], alpha=lora["alpha"], targets=tuple(lora["targets"]),
                        dropout=lora.get("dropout", 0.0))  # fmt: skip
    model = row["model"]
    if model.startswith("data/"):
        model = str(repo_root() / model)
    return estimate_memory(
        model, world_size=row["world_size"], strategy=row["strategy"], recipe=row["recipe"],
        seq_len=row["seq_len"], micro_batch=row["micro_batch"], lora=spec,
        activation_checkpointing=row.get("activation_checkpointing", False), ac_mode=row.get("ac_mode", "full"),
        fsdp_version=row["fsdp_version"], offload=row.get("offload", False),
        lora_layout="adapter-units" if row.get("layout") == "adapter-units" else "in-unit",
        legacy_hf_loss=row.get("hf_loss") == "legacy", loss_path=row.get("loss_path", "transformers"),
        ac_every=row.get("ac_every"),
    )  # fmt: skip


@contextlib.contextmanager
def named_row(row: dict) -> Iterator[None]:
    """Re-raise a ConfigError from inside the block prefixed with the rows file and ``row``'s id."""
    try:
        yield
    except ConfigError as err:
        raise ConfigError(f"{ROWS_PATH}, row {row['id']!r}: {err}") from err


def _memory_rows(row: dict) -> list[dict]:
    """One output row per memory number of a published row (reserved, allocated), with error % if modelled."""
    out = []
    measured = {k[: -len("_gib")]: v for k, v in row["measured"].items() if k.endswith("_gib")}
    modelled = row.get("modelled", True) and "recipe" in row
    with named_row(row):  # a refusal from the estimator names the row it came from
        est = estimate_row(row) if modelled else None
    for what, published in measured.items():
        rec = {"id": row["id"], "source": row["source"], "what": what, "published_gib": published,
               "modelled": modelled, "reason": row.get("reason", "")}  # fmt: skip
        if est is not None:
            # the torch the run used: FSDP2 before pytorch#129721 made its reduce-scatter input in that stream
            rs_stream = row.get("fsdp2_rs_input") == "reduce-scatter stream"
            reserved = reserved_parts(est, rs_input_on_rs_stream=rs_stream)["reserved"]
            got = {
                "reserved": reserved,
                "allocated": est.moments[est.peak_moment],
                "active": est.active_bytes,
            }[what]
            rec.update(
                estimate_gib=round(got / GIB, 3),
                error_pct=round(100 * (got / GIB - published) / published, 2),
                within_tolerance=abs(got / GIB - published) <= TOLERANCE_PCT[what] * published / 100,
                published_outcome="ran" if row["outcome"] == "ran" else "out of memory",
                estimated_outcome=verdict(est, get_gpu(None, row["gpu_memory_gib"])),
            )
            if (
                what == "reserved"
            ):  # the estimate's residuals against the replay (``reserved.reserved_range_bytes``)
                lo, hi = reserved_range_bytes(reserved)
                rec.update(published_range_gib=f"{lo / GIB:.1f} to {hi / GIB:.1f}",
                           within_range=lo / GIB <= published <= hi / GIB)  # fmt: skip
        out.append(rec)
    return out


def mfu_rows(rows: list[dict]) -> list[dict]:
    """Published tokens/s per GPU against the MFU torchtitan's formula gives (``6 N + 12 L H Q T`` FLOPs per
    token, N all parameters, over the GPU's bf16 dense peak): the calibration ``calibrated_mfu`` draws from."""
    out = []
    for row in rows:
        if "tokens_per_s_per_gpu" not in row["measured"] or "gpu" not in row:
            continue
        cfg = resolve_model_config(str(repo_root() / row["model"]))
        n = count_parameters(cfg).total
        hd = cfg.hidden_size // cfg.num_attention_heads
        flops = 6 * n + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * hd * row["seq_len"]
        tps = row["measured"]["tokens_per_s_per_gpu"]
        mfu = 100 * flops * tps / (get_gpu(row["gpu"]).bf16_dense_tflops * 1e12)
        pub = row["measured"].get("mfu_pct")
        out.append({"id": row["id"], "source": row["source"], "gpu": row["gpu"], "tokens_per_s_per_gpu": tps,
                    "published_mfu_pct": pub, "formula_mfu_pct": round(mfu, 2),
                    "error_pct": round(100 * (mfu - pub) / pub, 2) if pub else None,
                    "ac": row.get("ac", "")})  # fmt: skip
    cal = calibrated_mfu(out)
    for (
        r
    ) in out:  # tokens/s the step-time model gives at 0.4 and at the calibration: (mfu / measured mfu) - 1
        r["error_pct_at_0.4"] = round(100 * (40.0 / r["formula_mfu_pct"] - 1), 1)
        r["error_pct_calibrated"] = round(100 * (100 * cal[r["gpu"]] / r["formula_mfu_pct"] - 1), 1)
    return out


def calibrated_mfu(mfu_table: list[dict] | None = None) -> dict[str, float]:
    """Per GPU, the median MFU (a fraction, 3 places) of the published rows on it, by torchtitan's formula:
    what ``smolfsdp.estimate.scaling.estimate_step(mfu="calibrated")`` uses. In-sample: the error % beside
    each row (``mfu_rows``) is a fit's residual, not a prediction's."""
    table = mfu_table if mfu_table is not None else mfu_rows(load_rows()["rows"])
    by_gpu: dict[str, list[float]] = {}
    for r in table:
        by_gpu.setdefault(r["gpu"], []).append(r["formula_mfu_pct"] / 100)
    return {g: round(statistics.median(v), 3) for g, v in by_gpu.items()}


def check_table(path: str | Path | None = None) -> dict:
    """``{"memory": [...], "mfu": [...]}``: every published number beside today's estimate and its error %."""
    rows = load_rows(path)["rows"]
    memory = [
        r for row in rows if any(k.endswith("_gib") for k in row["measured"]) for r in _memory_rows(row)
    ]
    mfu = mfu_rows(rows)
    return {"memory": memory, "mfu": mfu, "calibrated_mfu": calibrated_mfu(mfu)}


def check_summary(table: dict | None = None) -> str:
    """One paragraph for the book: how many modelled rows of each kind are within their tolerance, and each
    miss with its error and whether the estimate's stated range holds it (``check_table``'s ``memory`` rows)."""
    rows = [r for r in (table or check_table())["memory"] if r["modelled"]]
    parts = []
    for what in ("allocated", "active", "reserved"):
        these = [r for r in rows if r["what"] == what]
        if these:
            ok = sum(r["within_tolerance"] for r in these)
            parts.append(f"{what}: {ok} of {len(these)} within {TOLERANCE_PCT[what]:.0f} %")
    misses = [r for r in rows if not r["within_tolerance"]]
    text = "; ".join(parts) + "."
    if misses:
        inside = " (inside the published range)"
        named = ", ".join(
            f"{r['id']} {r['what']} {r['error_pct']:+.1f} %" + (inside if r.get("within_range") else "")
            for r in misses
        )
        text += f" Missed: {named}."
    wrong = [r["id"] for r in rows if r["published_outcome"] == "ran" and r["estimated_outcome"] != "fits"]
    text += f" Verdicts that contradict the published outcome: {', '.join(wrong) or 'none'}."
    return text


def mfu_calibration(gpu_name: str, mfu_table: list[dict] | None = None) -> dict:
    """The MFU the step-time model uses by default on ``gpu_name`` (``scaling.estimate_step(mfu=None)``), with
    its provenance and its error against the published rows it comes from.

    ``mfu``: the median formula MFU (a fraction, 3 places) of the published rows on that GPU
    (``calibrated_mfu``); for a GPU with no published row, the median of every published row, pooled over GPUs
    (a stated fallback, not a calibration of that GPU). ``basis``: the GPU's name or ``"all GPUs"``. ``rows``:
    how many rows. ``error_pct``: (lowest, highest) error of the tokens/s this MFU gives against each of those
    rows, ``100 * (mfu / row MFU - 1)`` (in-sample residuals, not a prediction's error). ``text``: one line
    for the book."""
    table = mfu_table if mfu_table is not None else mfu_rows(load_rows()["rows"])
    rows = [r for r in table if r["gpu"] == gpu_name]
    basis = gpu_name if rows else "all GPUs"
    rows = rows or table
    mfu = round(statistics.median(r["formula_mfu_pct"] / 100 for r in rows), 3)
    errors = [100 * (100 * mfu / r["formula_mfu_pct"] - 1) for r in rows]
    lo, hi = round(min(errors), 1), round(max(errors), 1)
    where = f"{len(rows)} published {gpu_name} rows" if basis == gpu_name else (
        f"all {len(rows)} published rows (none on {gpu_name})"
    )  # fmt: skip
    text = (
        f"MFU {100 * mfu:.1f} %, the median of {where} (torchtitan, data/results/published/rows.json); "
        f"tokens/s at this MFU are {lo:+.1f} % to {hi:+.1f} % off those rows' (in-sample)"
    )
    return {"mfu": mfu, "basis": basis, "rows": len(rows), "error_pct": (lo, hi), "text": text}


# ------------------------------------------------------------------ FSDP1 vs FSDP2, the published pair
#: The published FSDP1-vs-FSDP2 pair: pytorch/torchtitan commit 83c879f18763611bda68586c45f0082fd568d646
#: ("Used per-parameter FSDP (#165)", Andrew Gu, 2024-03-28), its message: "1k steps of minipile on 8 H100
#: GPUs, local batch size 8, sequence length 2048, AC/SAC, bf16 mixed precision, fp32 reduce-scatter";
#: peak *active* memory in % of 95.0396 GiB. The parent commit's ``parallelize_llama.py``: FSDP1 FULL_SHARD,
#: ``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)``, ``BACKWARD_PRE``, ``use_orig_params=True``, each
#: ``TransformerBlock`` then the root wrapped; ``train_configs/llama_7b.toml``: the 7B flavour (dim 4096,
#: 32 layers, FFN 11008, 32,000-token vocabulary: ``data/models/llama2_7b``).
TORCHTITAN_PR165 = {
    "model": "data/models/llama2_7b",
    "world_size": 8,
    "seq_len": 2048,
    "micro_batch": 8,
    "gpu_gib": 95.0396,
    "peak_active_pct": {"AC": {"fsdp1": 24.81, "fsdp2": 23.92}, "SAC": {"fsdp1": 52.98, "fsdp2": 52.13}},
}


def published_difference_gib(ac: str = "AC") -> float:
    """FSDP1 - FSDP2 peak active GiB of :data:`TORCHTITAN_PR165` (``ac``: "AC" or "SAC")."""
    pct = TORCHTITAN_PR165["peak_active_pct"][ac]
    return (pct["fsdp1"] - pct["fsdp2"]) / 100 * TORCHTITAN_PR165["gpu_gib"]


def fsdp1_minus_fsdp2(model, *, world_size: int, **kwargs) -> dict[str, int]:
    """FSDP1 - FSDP2 bytes per rank at the step's peak, by component, for ``estimate_memory(model,
    world_size=..., **kwargs)`` (FULL_SHARD unless ``strategy`` says otherwise):

    * ``padding and layout``: the estimator's tensor peak (``moments``), FSDP1 minus FSDP2 (exact padding);
    * the two :func:`fsdp1_stream_held` blocks (FSDP1 holds them, active only);
    * ``FSDP2 reduce-scatter input kept``: ``record_stream.fsdp2_reduce_scatter_kept`` (FSDP2 holds it,
      allocated and active, from the first reduce-scatter of a backward on);
    * totals at the ``loss`` moment (no reduce-scatter yet) and during a layer's backward, ``allocated`` (what
      ``max_memory_allocated`` and the dry run see) and ``active`` (``memory_stats()["active_bytes.all.peak"]``,
      torchtitan's counter);
    * ``allocated, at the peaks``: the two estimates' peak moments, FSDP1 minus FSDP2 (what two dry runs'
      peaks differ by)."""
    one, two = (estimate_memory(model, world_size=world_size, fsdp_version=v, **kwargs) for v in (1, 2))
    # per moment: the estimator's own end-of-backward moments (``measure.root_grad``) already hold FSDP2's kept
    # root reduce-scatter input where it is the peak, so the kept layer input is taken off the layer moment only
    layout = one.moments["loss"] - two.moments["loss"]
    layer = one.moments["layer"] - two.moments["layer"]
    strategy = kwargs.get("strategy", "FULL_SHARD")
    group = 1 if strategy == "NO_SHARD" else one.shard_group
    lora = LoraSpec() if kwargs.get("lora") is True else (kwargs.get("lora") or None)
    held = fsdp1_stream_held(model, world_size=group, recipe=kwargs.get("recipe", "hf-fsdp-bf16"), lora=lora)
    kept = fsdp2_reduce_scatter_kept(
        model, world_size=group, recipe=kwargs.get("recipe", "hf-fsdp-bf16"), lora=lora
    )
    return {
        "padding and layout": layout, **held, "FSDP2 reduce-scatter input kept": kept,
        "allocated, loss moment": layout, "active, loss moment": layout + sum(held.values()),
        "allocated, layer backward": layer - kept, "active, layer backward": layer + sum(held.values()) - kept,
        "allocated, at the peaks": one.moments[one.peak_moment] - two.moments[two.peak_moment],
    }  # fmt: skip
