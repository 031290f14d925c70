"""The full-size dry run over a grid of setups, the estimator beside each: data/results/dryrun/grid.json.

Each setup runs ``smolfsdp.dryrun.run.dry_run`` in a fresh process (a fake process group per process) and
``smolfsdp.dryrun.compare.compare_with_estimate``; the file records the provenance (date, git SHA, versions,
machine, command). Chapter "Where the memory goes" reads it; ``tests/test_dryrun.py`` re-runs a subset.
Traced on fake tensors, not measured on a GPU (``smolfsdp.dryrun.run.LABEL``).

    python scripts/dryrun_grid.py                      # the grid below (12 setups), about 15 min on 2 cores
    python scripts/dryrun_grid.py --only book          # the book's two recipes only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "results" / "dryrun" / "grid.json"
FULL, LORA = "configs/runs/smollm3_3b_medical.yaml", "configs/runs/lora_smollm3_3b.yaml"
#: (label, recipe, overrides): the book's two recipes with one micro-batch per optimizer step (accumulation
#: adds no moment but the loss moment's gradients of the last micro-batch, which the estimate models), then
#: one axis at a time from them: FSDP version, LoRA, activation checkpointing, sequence length, world size.
GRID = [
    ("book: full fine-tune (FSDP1) recipe, 1 micro-batch", FULL, {"gradient_accumulation_steps": 1}),
    ("book: LoRA + FSDP2 recipe, 1 micro-batch", LORA, {"gradient_accumulation_steps": 1}),
]
for version in (1, 2):
    for lora in (False, True):
        for ac in (True, False):
            if (version, lora, ac) in ((1, False, True), (2, True, True)):
                continue  # the book's two recipes, above
            GRID.append((f"FSDP{version} {'LoRA' if lora else 'full'} AC {'on' if ac else 'off'} 2x2048 W2",
                         LORA if lora else FULL,
                         {"fsdp_version": version, "lora": lora, "activation_checkpointing": ac,
                          "gradient_accumulation_steps": 1}))  # fmt: skip
for recipe, name in ((FULL, "full"), (LORA, "LoRA")):
    GRID.append(
        (f"book {name} recipe 2x4096 W2", recipe, {"max_length": 4096, "gradient_accumulation_steps": 1})
    )
for world in (4, 8):
    GRID.append(
        (f"book full recipe 2x2048 W{world}", FULL, {"nproc": world, "gradient_accumulation_steps": 1})
    )


def one(item: tuple[str, str, dict]) -> dict:
    """One setup in this (fresh) process: the report, its comparison with the estimate, the time."""
    import warnings

    warnings.filterwarnings("ignore")
    from smolfsdp.config import load_config
    from smolfsdp.dryrun.compare import compare_with_estimate
    from smolfsdp.dryrun.run import dry_run

    label, recipe, overrides = item
    cfg = load_config(ROOT / recipe, **overrides)
    report = dry_run(cfg)
    out = report.to_dict()
    if not label.startswith("book:"):
        out.pop("series")  # the memory-over-time figure draws the book's recipes only
    out["what"] = out.pop("label")  # the dry run's own label (traced, not measured); "label" names the setup
    return {
        "label": label,
        "recipe": recipe,
        "overrides": overrides,
        **out,
        "estimate_vs_dry_run": compare_with_estimate(report, cfg).to_dict("records"),
    }


def provenance(command: str) -> dict:
    import torch
    import transformers

    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_sha": sha,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": f"{platform.machine()}, {mp.cpu_count()} cores, {platform.python_version()}",
        "command": command,
        "what": "traced on fake tensors (smolfsdp.dryrun), not measured on a GPU",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["book", "all"], default="all")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    grid = [g for g in GRID if args.only == "all" or g[0].startswith("book:")]
    rows, t0 = [], time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, maxtasksperchild=1) as pool:
        for i, row in enumerate(pool.imap(one, grid), 1):
            peak = next(r for r in row["estimate_vs_dry_run"] if r["component"].startswith("peak"))
            print(f"[{i}/{len(grid)}] {row['label']}: peak {row['peak_bytes'] / 2**30:.2f} GiB traced, "
                  f"{peak['estimate_gib']:.2f} estimated ({peak['error_pct']:+.1f} %), {row['seconds']:.0f} s",
                  flush=True)  # fmt: skip
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python scripts/dryrun_grid.py " + " ".join(sys.argv[1:])
    args.out.write_text(json.dumps({"provenance": provenance(cmd.strip()), "runs": rows}, indent=1) + "\n")
    print(f"{len(rows)} setups in {time.perf_counter() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
