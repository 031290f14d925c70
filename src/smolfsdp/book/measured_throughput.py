"""What padding, packing and activation checkpointing cost on a GPU: the H200 measurements, read for the page.

Reads ``data/results/h200/gpu_throughput.json`` and ``gpu_attention_checks.json`` (``scripts/gpu_throughput.py``
on one NVIDIA H200, 2026-12-04; how they were made: ``data/results/h200/README.md``). One GPU, no FSDP, SmolLM3-3B
geometry with random weights, fp32 parameters under bf16 autocast, SDPA: forward + backward of one micro-batch,
so the times are the compute of a step without its collectives. Every ratio here is of two medians measured in
the same run, given with the spread (fastest and slowest of the timed passes). Returns ``None`` where the
files are absent, and the page then says no measurement exists.

    python -c "from smolfsdp.book.measured_throughput import measured_table as t; print(t())"
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from smolfsdp.measure.results import GPU_RESULTS_DIR
from smolfsdp.paths import repo_root

GIB = 2**30
BATCH_WORDS = {
    "causal": "2 full rows x 2,048 (no padding, causal kernel)",
    "padded": "2 rows padded to 2,048 (82.5 % real)",
    "packed": "4 rows packed into 4,096 (block mask)",
    "packed8k": "5 rows packed into 8,192 (block mask)",
}


@cache
def _load(name: str, folder: str | None = None) -> dict[str, Any] | None:
    path = Path(folder or repo_root() / GPU_RESULTS_DIR) / name
    return json.loads(path.read_text()) if path.is_file() else None


def measured_table(folder: str | None = None) -> pd.DataFrame | None:
    """One row per micro-batch shape and checkpointing setting: median ms per forward + backward, spread,
    real tokens/s, peak allocated and reserved GiB. None without the file."""
    data = _load("gpu_throughput.json", folder)
    if data is None:
        return None
    rows = []
    for r in data["rows"]:
        rows.append(
            {
                "micro-batch": BATCH_WORDS.get(r["batch"], r["batch"]),
                "activation checkpointing": "on" if r["activation_checkpointing"] else "off",
                "ms (median)": round(1000 * r["median_s"], 1),
                "ms (fastest-slowest)": f"{1000 * r['min_s']:.1f}-{1000 * r['max_s']:.1f}",
                "real tokens/s": round(r["tokens_real"] / r["median_s"]),
                "peak allocated (GiB)": round(r["peak_allocated_bytes"] / GIB, 2),
                "peak reserved (GiB)": round(r["peak_reserved_bytes"] / GIB, 2),
            }
        )
    return pd.DataFrame(rows)


def _row(data, batch: str, ac: bool) -> dict[str, Any]:
    return next(r for r in data["rows"] if r["batch"] == batch and r["activation_checkpointing"] == ac)


def measured_facts(folder: str | None = None) -> dict[str, Any] | None:
    """The ratios the page states, each of two medians from one run: ``ac_cost`` (time with checkpointing every
    layer / without, full causal rows), ``ac_activation_gib`` (peak allocated without - with), ``packed_vs_padded``
    (real tokens/s packed / padded), ``mask_cost`` (packed / causal ms for the same 4,096 tokens), ``flex_vs_sdpa``
    (flex_attention / SDPA ms on the packed micro-batch), and the rows-apart check (max |logit| difference of a
    packed row vs alone: fp32, bf16, and with the KV cache on)."""
    data, checks = _load("gpu_throughput.json", folder), _load("gpu_attention_checks.json", folder)
    if data is None:
        return None
    on, off = _row(data, "causal", True), _row(data, "causal", False)
    padded, packed = _row(data, "padded", False), _row(data, "packed", False)
    facts = {
        "device": data["device"],
        "date": data["date"][:10],
        "ac_cost": on["median_s"] / off["median_s"],
        "ac_cost_spread": (on["min_s"] / off["max_s"], on["max_s"] / off["min_s"]),
        "ac_activation_gib": (off["peak_allocated_bytes"] - on["peak_allocated_bytes"]) / GIB,
        "packed_vs_padded": (packed["tokens_real"] / packed["median_s"])
        / (padded["tokens_real"] / padded["median_s"]),
        "mask_cost": packed["median_s"] / off["median_s"],
        "padded_real_share": padded["tokens_real"] / padded["tokens_computed"],
        # the real share at which padded rows would match packed ones per real token: packed real tokens/s over
        # padded computed tokens/s (the padded kernel's time does not depend on how much of its row is padding)
        "break_even_share": (packed["tokens_real"] / packed["median_s"])
        / (padded["tokens_computed"] / padded["median_s"]),
    }
    if checks:
        facts["rows_apart"] = {k: v["max_abs_diff"] for k, v in checks["rows_apart"].items()}
        facts["max_abs_logit"] = checks["rows_apart"]["fp32"]["max_abs_logit"]
        flex = checks["flex_attention"].get("packed_ac_off_s")
        if flex:
            facts["flex_vs_sdpa"] = sorted(flex)[len(flex) // 2] / packed["median_s"]
    return facts


def measured_markdown(folder: str | None = None) -> str:
    """The paragraph the page prints under the table (or that no measurement exists)."""
    f = measured_facts(folder)
    if f is None:
        return "**No GPU measurement of padding, packing or checkpointing exists yet** (`scripts/gpu_throughput.py`)."
    lo, hi = f["ac_cost_spread"]
    text = (
        f"Measured on one {f['device']} ({f['date']}), one process, no FSDP: checkpointing every decoder layer made "
        f"a micro-batch of 2 x 2,048 full rows take **{f['ac_cost']:.2f}x** as long ({lo:.2f}-{hi:.2f}x over the "
        f"timed passes) and held {f['ac_activation_gib']:.1f} GiB less at the peak. Packed rows ran "
        f"**{100 * (f['packed_vs_padded'] - 1):+.0f} %** real tokens/s against rows padded to "
        f"{100 * f['padded_real_share']:.1f} % real: SDPA's block-diagonal mask cost {100 * (f['mask_cost'] - 1):.0f} % "
        "more time per token than the causal kernel, which takes back most of what padding wasted: the two break even "
        f"where padded rows are {100 * f['break_even_share']:.0f} % real"
    )
    if "flex_vs_sdpa" in f:
        text += f"; flex_attention ran the same packed micro-batch in {f['flex_vs_sdpa']:.2f}x SDPA's time"
    text += "."
    if "rows_apart" in f:
        r = f["rows_apart"]
        text += (
            f" No row attends to another: a packed row's logits equal that row run alone to {r['fp32']:.1e} in fp32 "
            f"(largest logit {f['max_abs_logit']:.1f}); with SmolLM3's `use_cache=True` left on, transformers builds no "
            f"packed-row mask and they differ by {r['fp32_use_cache']:.1f}."
        )
    return text
