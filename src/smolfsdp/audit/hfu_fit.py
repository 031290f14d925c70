"""The step-time model's compute rate calibrated as hardware FLOPs utilisation, recomputation counted.

``smolfsdp.audit.published_rows.mfu_calibration`` takes the median model FLOPs utilisation (MFU) of the published
rows on a GPU. MFU does not count the forward that activation checkpointing runs again, so rows that recompute
more show a lower MFU for the same hardware rate: torchtitan's three A100 rows (64 GPUs, FSDP2, seq 8192) have
MFU 56.8 % (Llama 3 8B, every 2nd layer checkpointed), 58.2 % (8B, op-level selective) and 51.7 % (70B, full
checkpointing), a spread of 12 %; the median MFU is 9.8 % fast on the 70B row. Counting each row's recomputation
(``smolfsdp.estimate.recompute``: what torch's checkpoint runs again, held to counted FLOPs), the hardware FLOPs
utilisation ``HFU = MFU x (F + R) / F`` (F the model FLOPs per token, R the recomputed; Korthikanti et al. 2022,
sec. 6) is 63.6 %, 63.1 % and 64.5 %: within 2.4 %. So the rate is calibrated as HFU, and a run's MFU is
``HFU x F / (F + R)`` for its own checkpointing.

The AC mode of each row is read from the row (``ac_mode``, or the A100 table's "selective layer" / "selective op"
/ "full"; "selective layer" is torchtitan's ``selective_ac_option = '2'`` of its configs then: every 2nd layer).

    python -c "from smolfsdp.audit.hfu_fit import hfu_calibration; print(hfu_calibration('A100 80GB')['text'])"

The estimator reads the result from a committed file (``smolfsdp.estimate.calibration``), never this module.
"""

from __future__ import annotations

import statistics

from smolfsdp.audit.published_rows import load_rows, mfu_calibration, mfu_rows
from smolfsdp.estimate.calibration import POOLED
from smolfsdp.estimate.recompute import recompute_share
from smolfsdp.paths import repo_root

#: the A100 table's words for its checkpointing -> (ac_mode, ac_every)
AC_WORDS = {"selective layer": ("layer", 2), "selective op": ("op", None), "full": ("full", None)}


def row_ac(row: dict) -> tuple[str | None, int | None]:
    """(ac_mode, ac_every) a published row ran with (None: no activation checkpointing)."""
    if row.get("ac") in AC_WORDS:
        return AC_WORDS[row["ac"]]
    if row.get("activation_checkpointing"):
        return row.get("ac_mode", "full"), row.get("ac_every")
    return None, None


def hfu_rows(rows: list[dict] | None = None) -> list[dict]:
    """``mfu_rows`` with each row's checkpointing, the share of the step's model FLOPs it recomputes and the
    HFU (percent) that gives: ``{"id", "gpu", "ac_mode", "ac_every", "formula_mfu_pct", "recompute_pct",
    "formula_hfu_pct"}``."""
    rows = rows if rows is not None else load_rows()["rows"]
    out = []
    for row in rows:
        for m in mfu_rows([row]):
            mode, every = row_ac(row)
            share = recompute_share(str(repo_root() / row["model"]), mode, every, seq_len=row["seq_len"])[
                "of_step"
            ]
            out.append({"id": m["id"], "gpu": m["gpu"], "ac_mode": mode, "ac_every": every,
                        "formula_mfu_pct": m["formula_mfu_pct"], "recompute_pct": round(100 * share, 2),
                        "formula_hfu_pct": round(m["formula_mfu_pct"] * (1 + share), 2)})  # fmt: skip
    return out


def hfu_calibration(gpu_name: str, table: list[dict] | None = None) -> dict:
    """The median HFU (a fraction, 3 places) of the published rows on ``gpu_name`` (pooled over every row for a
    GPU without any, a stated fallback), with ``error_pct`` (lowest, highest) of the tokens/s it gives against
    each of those rows, each with its own recomputation (in-sample residuals), and the same for the median MFU
    (``mfu_error_pct``) to compare. Keys: ``hfu``, ``basis``, ``rows``, ``error_pct``, ``mfu_error_pct``, ``text``."""
    table = table if table is not None else hfu_rows()
    rows = [r for r in table if r["gpu"] == gpu_name]
    basis = gpu_name if rows else "all GPUs"
    rows = rows or table
    hfu = round(statistics.median(r["formula_hfu_pct"] / 100 for r in rows), 3)
    mfu = round(statistics.median(r["formula_mfu_pct"] / 100 for r in rows), 3)
    errors = [100 * (100 * hfu / r["formula_hfu_pct"] - 1) for r in rows]
    mfu_errors = [100 * (100 * mfu / r["formula_mfu_pct"] - 1) for r in rows]
    span = lambda e: (round(min(e), 1), round(max(e), 1))  # noqa: E731
    # each row predicted from the others (3+ rows): out of sample, unlike the residuals above
    held = [[100 * (statistics.median(o[key] for o in rows if o is not r) / r[key] - 1) for r in rows]
            for key in ("formula_hfu_pct", "formula_mfu_pct")] if len(rows) >= 3 else None  # fmt: skip
    where = f"{len(rows)} published {gpu_name} rows" if basis == gpu_name else (
        f"all {len(rows)} published rows (none on {gpu_name})"
    )  # fmt: skip
    lo, hi = span(errors)
    text = (
        f"HFU {100 * hfu:.1f} %, the median of {where} with each row's recomputation counted (torchtitan, "
        f"data/results/published/rows.json; smolfsdp.audit.hfu_fit); tokens/s at this HFU are {lo:+.1f} % to "
        f"{hi:+.1f} % off those rows' (in-sample; the median MFU: {span(mfu_errors)[0]:+.1f} % to "
        f"{span(mfu_errors)[1]:+.1f} %)"
    )
    if held:
        text += (
            f"; each row predicted from the others: {span(held[0])[0]:+.1f} % to {span(held[0])[1]:+.1f} % "
            f"(the median MFU: {span(held[1])[0]:+.1f} % to {span(held[1])[1]:+.1f} %)"
        )
    return {"hfu": hfu, "basis": basis, "rows": len(rows), "error_pct": (lo, hi),
            "mfu_error_pct": span(mfu_errors), "held_out_error_pct": held and (span(held[0]), span(held[1])),
            "text": text}  # fmt: skip


def calibration_record() -> dict:
    """What ``scripts/published_check.py`` writes to ``smolfsdp.estimate.calibration.CALIBRATION_PATH``: per GPU with
    published rows, and pooled over all of them (``"all GPUs"``, its text with ``{gpu}`` where a GPU's name goes),
    the MFU calibration (``published_rows.mfu_calibration``) and the HFU calibration (:func:`hfu_calibration`)."""
    mfu_table = mfu_rows(load_rows()["rows"])
    table = hfu_rows()
    gpus = sorted({r["gpu"] for r in mfu_table})
    record = {
        "mfu": {g: mfu_calibration(g, mfu_table) for g in gpus},
        "hfu": {g: hfu_calibration(g, table) for g in gpus},
    }
    record["mfu"][POOLED] = mfu_calibration("{gpu}", mfu_table)
    record["hfu"][POOLED] = hfu_calibration("{gpu}", table)
    for kind in record.values():  # JSON has lists, not tuples: the committed file and this compare equal
        for entry in kind.values():
            for k, v in entry.items():
                if isinstance(v, tuple):
                    entry[k] = [list(x) if isinstance(x, tuple) else x for x in v]
    return record
