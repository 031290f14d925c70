"""The step-time model's compute rate: the calibration fitted to published GPU runs, read from a committed file.

The estimator does not fit anything at run time. ``smolfsdp.audit.hfu_fit`` fits the rate to the published
rows (``data/results/published/rows.json``: torchtitan's tokens/s on A100s and H100s) and
``scripts/published_check.py`` writes the result to :data:`CALIBRATION_PATH`; tests/test_published.py holds the
committed file equal to what the audit computes today. Two rates per GPU:

* ``mfu``: the median model FLOPs utilisation of the rows on that GPU (torchtitan's ``6N + 12 L H Q T``);
* ``hfu``: the median hardware FLOPs utilisation, each row's recomputation counted (``HFU = MFU x (F + R) / F``,
  Korthikanti et al. 2022 sec. 6; ``smolfsdp.estimate.recompute``). A run's MFU is ``HFU x F / (F + R)`` for its
  own activation checkpointing (:func:`run_mfu`).

A GPU with no published row gets the rate pooled over every row, and its text says so. Chapter "Scaling out";
``smolfsdp.estimate.scaling.estimate_step`` uses it when no MFU is given.

    python -c "from smolfsdp.estimate.calibration import run_mfu; print(run_mfu('H100 SXM', 'smollm3-3b', seq_len=2048, ac_mode='full')['text'])"
"""

from __future__ import annotations

import functools
import json

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.recompute import recompute_share
from smolfsdp.paths import repo_root

CALIBRATION_PATH = "data/results/published/calibration.json"
POOLED = "all GPUs"  # the key of the rate pooled over every published row


@functools.cache
def load_calibration() -> dict:
    """The committed calibration: ``{"mfu": {gpu | "all GPUs": {...}}, "hfu": {...}, "provenance": {...}}``.
    Raises ConfigError when the file is missing (``python scripts/published_check.py`` writes it)."""
    path = repo_root() / CALIBRATION_PATH
    if not path.is_file():
        raise ConfigError(
            f"{CALIBRATION_PATH} is missing: run `python scripts/published_check.py` to write it."
        )
    return json.loads(path.read_text())


def _entry(kind: str, gpu_name: str) -> dict:
    table = load_calibration()[kind]
    if gpu_name in table:
        return dict(table[gpu_name])
    pooled = dict(table[POOLED])
    pooled["text"] = pooled["text"].replace("{gpu}", gpu_name)
    return pooled


def mfu_calibration(gpu_name: str) -> dict:
    """The median published MFU on ``gpu_name`` (pooled over every row for a GPU without any): ``{"mfu"`` (a
    fraction, 3 places), ``"basis"``, ``"rows"``, ``"error_pct"`` (in-sample residuals of tokens/s), ``"text"}``."""
    return _entry("mfu", gpu_name)


def hfu_calibration(gpu_name: str) -> dict:
    """The median published HFU on ``gpu_name`` (recomputation counted; pooled for a GPU without rows):
    ``{"hfu", "basis", "rows", "error_pct", "mfu_error_pct", "held_out_error_pct", "text"}``."""
    return _entry("hfu", gpu_name)


def calibrated_mfu() -> dict[str, float]:
    """``{gpu: median MFU}`` for the GPUs with published rows (no pooled entry)."""
    return {g: e["mfu"] for g, e in load_calibration()["mfu"].items() if g != POOLED}


def run_mfu(
    gpu_name: str, model, *, seq_len: int, ac_mode: str | None, ac_every: int | None = None, lora=None
) -> dict:
    """The MFU a run with this checkpointing gets at the GPU's calibrated HFU: ``HFU / (1 + R / F)``.
    ``ac_mode`` None: no checkpointing (MFU = HFU). Keys: ``mfu`` (a fraction, 3 places), ``hfu``, ``text``."""
    cal = hfu_calibration(gpu_name)
    share = recompute_share(model, ac_mode, ac_every, seq_len=seq_len, lora=lora)["of_step"]
    mfu = round(cal["hfu"] / (1 + share), 3)
    ac = "no activation checkpointing" if ac_mode is None else f"activation checkpointing {ac_mode}"
    text = f"MFU {100 * mfu:.1f} % ({ac}: +{100 * share:.0f} % FLOPs recomputed) from the {cal['text']}"
    return {"mfu": mfu, "hfu": cal["hfu"], "text": text}
