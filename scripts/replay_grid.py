"""The caching allocator replayed on the book's recipes: data/results/dryrun/replay_grid.json.

For each of 16 SmolLM3-3B setups (FSDP1 / FSDP2 x full fine-tune / LoRA x activation checkpointing on / off x 2
and 8 ranks, 2 x 2,048 tokens, one micro-batch, each from its book recipe) the dry run
(``smolfsdp.audit.dryrun.dry_run.dry_run``) records the step's allocation order and ``smolfsdp.audit.allocator_replay.replay``
runs it through the CUDA caching allocator's policy: peak reserved bytes and each stream pool's segments. The
estimator's default-pool factor (``smolfsdp.estimate.reserved.DEFAULT_POOL_FACTOR``) is fitted to these rows;
tests/test_published.py holds the constant to the fit and re-traces one row. Traced and replayed on a CPU, not
measured on a GPU.

    python scripts/replay_grid.py      # about 2 min on 2 cores
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "results" / "dryrun" / "replay_grid.json"
FULL, LORA = "configs/runs/smollm3_3b_medical.yaml", "configs/runs/lora_smollm3_3b.yaml"
SETUPS = [
    {"fsdp_version": v, "lora": lora, "activation_checkpointing": ac, "max_length": 2048, "nproc": w,
     "gradient_accumulation_steps": 1}
    for v in (1, 2) for lora in (False, True) for ac in (True, False) for w in (2, 8)
]  # fmt: skip


def replay_row(overrides: dict) -> dict:
    """One setup: its recipe and overrides, the dry run's tensor peak, the replay's peaks and pools (bytes)."""
    from smolfsdp.audit.allocator_replay import replay
    from smolfsdp.audit.dryrun.dry_run import dry_run
    from smolfsdp.config import load_config
    from smolfsdp.estimate.reserved import CUBLAS_WORKSPACE_BYTES

    recipe = LORA if overrides["lora"] else FULL
    cfg = load_config(ROOT / recipe, **overrides)
    t0 = time.perf_counter()
    report = dry_run(cfg, overrides["nproc"], progress=lambda m: None)
    out = replay(report.alloc_events)
    return {
        "recipe": recipe, "overrides": overrides, "loss_path": report.setup["loss_path"],
        "optimizer": report.setup["optimizer"],
        "tensor_peak_bytes": report.peak_bytes, "peak_moment": report.peak_moment,
        "replay_reserved_bytes": out["peak_reserved"] + CUBLAS_WORKSPACE_BYTES,
        "replay_active_bytes": out["peak_active"], "segments_by_stream_bytes": out["reserved_by_stream"],
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip


def main() -> int:
    sys.path.insert(0, str(ROOT / "scripts"))
    from dryrun_grid import provenance

    rows = []
    for i, ov in enumerate(SETUPS, 1):
        rows.append(replay_row(ov))
        r = rows[-1]
        print(f"{i}/{len(SETUPS)} {ov}: tensors {r['tensor_peak_bytes'] / 2**30:.2f} GiB, replayed reserved "
              f"{r['replay_reserved_bytes'] / 2**30:.2f} GiB ({r['seconds']} s)", flush=True)  # fmt: skip
    prov = provenance("python scripts/replay_grid.py")
    prov["what"] = (
        "traced on fake tensors (smolfsdp.audit.dryrun) and replayed through smolfsdp.audit.allocator_replay, not measured on a GPU"
    )
    OUT.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(rows)} setups")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
