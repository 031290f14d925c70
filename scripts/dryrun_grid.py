"""The full-size dry run over a grid of setups, the estimator beside each: data/results/dryrun/grid.json.

Each setup runs ``smolfsdp.audit.dryrun.dry_run.dry_run`` in a fresh process (a fake process group per process) and
``smolfsdp.audit.dryrun.compare.compare_with_estimate``; the file records the provenance (date, git SHA, versions,
machine, command). Chapter "Where the memory goes" reads it; ``tests/test_dryrun.py`` re-runs a subset.
Traced on fake tensors, not measured on a GPU (``smolfsdp.audit.dryrun.dry_run.LABEL``).

    python scripts/dryrun_grid.py --workers 2          # the grid below (48 setups), about 20 min on 2 cores
    python scripts/dryrun_grid.py --workers 2 --resume # keep the setups already in the file, trace the rest
    python scripts/dryrun_grid.py --reestimate         # the committed rows against the current estimator (prints)
    python scripts/dryrun_grid.py --reestimate --write # ... and rewrites the file's estimates
    python scripts/dryrun_grid.py --only book          # the book's two recipes only
    python scripts/dryrun_grid.py --grid shapes --workers 2   # SmolLM3-3B, Llama 3.x, Qwen2.5 (shapes.json)
    python scripts/dryrun_grid.py --grid recipe        # the book's full fine-tune as configured (recipe.json)
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
#: (label, recipe, overrides): the issue's whole grid, FSDP1 and FSDP2 x full fine-tune and LoRA x activation
#: checkpointing on and off x sequence 2048 and 4096 x world 2, 4, 8 (48 setups), each from the book recipe of
#: its kind (full: configs/runs/smollm3_3b_medical.yaml, LoRA: configs/runs/lora_smollm3_3b.yaml) with one
#: micro-batch per optimizer step (accumulation adds no moment but the loss moment's gradients of the last
#: micro-batch, which the estimate models). The book's two recipes come first (their memory series is kept for
#: the chapter's figure), then the FSDP2 setups, then FSDP1 (10-60 s each on 2 cores).
BOOK = {(1, False, True, 2048, 2): "book: full fine-tune (FSDP1) recipe, 1 micro-batch",
        (2, True, True, 2048, 2): "book: LoRA + FSDP2 recipe, 1 micro-batch"}  # fmt: skip


def _setups() -> list[tuple[str, str, dict]]:
    keys = [(v, lora, ac, seq, w) for v in (1, 2) for lora in (False, True) for ac in (True, False)
            for seq in (2048, 4096) for w in (2, 4, 8)]  # fmt: skip
    keys.sort(
        key=lambda k: (k not in BOOK, list(BOOK).index(k) if k in BOOK else 0, k[0] == 1, k[0] == 1 and k[1])
    )
    out = []
    for v, lora, ac, seq, w in keys:
        label = BOOK.get((v, lora, ac, seq, w)) or (
            f"FSDP{v} {'LoRA' if lora else 'full'} AC {'on' if ac else 'off'} 2x{seq} W{w}"
        )
        overrides = {"fsdp_version": v, "lora": lora, "activation_checkpointing": ac, "max_length": seq,
                     "nproc": w, "gradient_accumulation_steps": 1}  # fmt: skip
        out.append((label, LORA if lora else FULL, overrides))
    return out


GRID = _setups()
SHAPES_OUT = ROOT / "data" / "results" / "dryrun" / "shapes.json"
#: The shapes grid (``--grid shapes``, issue 31): three models beside SmolLM3-3B, each config written from its
#: published dimensions (data/models/*/README.md): Llama 3.2 1B and Qwen2.5-1.5B tie the output layer to the embedding
#: as SmolLM3 does, Llama 3.1 8B does not (the root's gradient of smolfsdp.estimate.root_grad both ways). Each at a
#: short and a long sequence, for setups chosen to cover the moments of the estimate: 8 ranks at 2 x 128 tokens (the
#: end of backward, the root's gradient, is the peak), 2 x 2048 (saved activations), FSDP1 and FSDP2, full fine-tune
#: and LoRA, activation checkpointing on and off. SmolLM3-3B at 2 x 128 only: its long sequences are the 48 setups
#: of grid.json. About 15 min on 2 busy cores without Llama 3.1 8B.
SHAPE_MODELS = {"Llama-3.2-1B": "data/models/llama3_2_1b", "Qwen2.5-1.5B": "data/models/qwen2_5_1_5b",
                "Llama-3.1-8B": "data/models/llama3_1_8b"}  # fmt: skip
SHAPE_SETUPS = [
    (2, False, True, 8),
    (1, False, False, 8),
    (2, True, True, 2),
]  # FSDP version, LoRA, AC, ranks


def _shape_setups() -> list[tuple[str, str, dict]]:
    """(label, recipe, overrides) of the shapes grid: SmolLM3-3B at 2 x 128 (SHAPE_SETUPS and FSDP1 with
    checkpointing on 2 ranks), then SHAPE_MODELS x 2 x 128 and 2 x 2048 x SHAPE_SETUPS, then SmolLM3-3B FSDP1 LoRA
    with ``lora_layout: adapter-units`` at 2 x 128 and 2 x 2048 on 2 ranks."""
    keys = [("SmolLM3-3B", 128, *s) for s in [*SHAPE_SETUPS, (1, False, True, 2)]]
    keys += [(name, seq, *s) for name in SHAPE_MODELS for seq in (128, 2048) for s in SHAPE_SETUPS]
    models = {"SmolLM3-3B": "HuggingFaceTB/SmolLM3-3B", **SHAPE_MODELS}
    out = []
    for name, seq, v, lora, ac, w in keys:
        label = f"{name} FSDP{v} {'LoRA' if lora else 'full'} AC {'on' if ac else 'off'} 2x{seq} W{w}"
        overrides = {"model": models[name], "fsdp_version": v, "lora": lora, "activation_checkpointing": ac,
                     "max_length": seq, "nproc": w, "gradient_accumulation_steps": 1}  # fmt: skip
        out.append((label, LORA if lora else FULL, overrides))
    for seq in (128, 2048):  # FSDP1 LoRA with each adapter its own unit (lora_layout, smolfsdp.lora_options)
        overrides = {"model": models["SmolLM3-3B"], "fsdp_version": 1, "lora": True, "lora_layout": "adapter-units",
                     "activation_checkpointing": True, "max_length": seq, "nproc": 2, "gradient_accumulation_steps": 1}  # fmt: skip
        out.append((f"SmolLM3-3B FSDP1 LoRA adapter-units AC on 2x{seq} W2", LORA, overrides))
    return out


SHAPES = _shape_setups()
RECIPE_OUT = ROOT / "data" / "results" / "dryrun" / "recipe.json"
#: The recipe grid (``--grid recipe``): the book's full fine-tune recipe exactly as configured, its engine's loss
#: and AdamW step included (TRL's fused LM head, the Trainer's fused AdamW; 8 micro-batches of 2 x 2048 tokens):
#: the peak every page quotes (``smolfsdp.estimate.recipe_peak``), traced. About 3 min on 2 cores.
RECIPE = [("book: full fine-tune (FSDP1) recipe as configured", FULL, {})]


def one(item: tuple[str, str, dict]) -> dict:
    """One setup in this (fresh) process: the report, its comparison with the estimate, the time."""
    import warnings

    warnings.filterwarnings("ignore")
    from smolfsdp.audit.dryrun.compare import compare_with_estimate
    from smolfsdp.audit.dryrun.dry_run import dry_run
    from smolfsdp.config import load_config

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
        "what": "traced on fake tensors (smolfsdp.audit.dryrun), not measured on a GPU",
    }


def reestimate(path: Path, write: bool = False) -> list[str]:
    """Recompute every row's ``estimate_vs_dry_run`` from its committed traced bytes (seconds, no dry run)
    and print, per setup and component, the committed estimate, the new one and the new error against the
    traced bytes (GiB, %). The file is rewritten only with ``write`` (``--write``): the traced half stays as
    it was traced (its provenance unchanged) and ``provenance["estimated"]`` records the commit the
    estimates come from. Returns the printed lines."""
    from smolfsdp.audit.dryrun.compare import compare_committed

    grid = json.loads(path.read_text())
    lines, changed = [], 0
    for row in grid["runs"]:
        old = {r["component"]: r for r in row["estimate_vs_dry_run"]}
        new = compare_committed(row, ROOT).to_dict("records")
        for r in new:
            was = old.get(r["component"], {}).get("estimate_gib")
            moved = was is None or abs(was - r["estimate_gib"]) > 1e-9
            changed += moved
            if moved:
                was_s = "new" if was is None else f"{was:9.3f}"
                lines.append(
                    f"{row['label']} | {r['component']}: estimate {was_s} -> {r['estimate_gib']:9.3f} GiB "
                    f"(dry run {r['dry_run_gib']:.3f} GiB, error {r['error_pct']:+.2f} %)"
                )
        row["estimate_vs_dry_run"] = new
    worst = max(
        (abs(r["error_pct"]) for row in grid["runs"] for r in row["estimate_vs_dry_run"]), default=0.0
    )
    lines.append(
        f"{changed} estimate(s) changed over {len(grid['runs'])} setups; the largest error now {worst:.2f} %"
    )
    if write:
        grid["provenance"]["estimated"] = {k: provenance("")[k] for k in ("date", "git_sha")}
        path.write_text(json.dumps(grid, indent=1) + "\n")
        lines.append(f"wrote the new estimates -> {path}")
    else:
        lines.append(f"{path} left as it was (--write rewrites its estimates)")
    print("\n".join(lines))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", choices=["smollm3", "shapes", "recipe"], default="smollm3",
                        help="smollm3: the 48 SmolLM3-3B setups (grid.json); shapes: SHAPES (shapes.json); "
                        "recipe: the book's full fine-tune as configured (recipe.json)")  # fmt: skip
    parser.add_argument("--only", choices=["book", "all"], default="all")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: grid.json, or shapes.json for shapes"
    )
    parser.add_argument("--resume", action="store_true", help="keep the setups the --out file already holds")
    parser.add_argument("--reestimate", action="store_true",
                        help="recompute the estimates of the committed traced rows only (no dry run) and print "
                        "what changed")  # fmt: skip
    parser.add_argument("--write", action="store_true", help="with --reestimate: rewrite --out's estimates")
    args = parser.parse_args()
    args.out = args.out or {"shapes": SHAPES_OUT, "recipe": RECIPE_OUT}.get(args.grid, OUT)
    if args.reestimate:
        reestimate(args.out, write=args.write)
        return None
    grid = [
        g
        for g in {"shapes": SHAPES, "recipe": RECIPE}.get(args.grid, GRID)
        if args.only == "all" or g[0].startswith("book:")
    ]
    done = {}
    if (
        args.resume and args.out.is_file()
    ):  # keep what an earlier, interrupted run traced (each row has its commit)
        before = json.loads(args.out.read_text())
        done = {r["label"]: {"git_sha": before["provenance"]["git_sha"], **r} for r in before["runs"]}
    rows, t0 = [done[g[0]] for g in grid if g[0] in done], time.perf_counter()
    todo = [g for g in grid if g[0] not in done]
    print(f"{len(rows)} setups kept from {args.out}, {len(todo)} to trace", flush=True)
    cmd = ("python scripts/dryrun_grid.py " + " ".join(sys.argv[1:])).strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sha = provenance(cmd)["git_sha"]
    with mp.get_context("spawn").Pool(args.workers, maxtasksperchild=1) as pool:
        for i, row in enumerate(pool.imap(one, todo), len(rows) + 1):
            row["git_sha"] = sha
            peak = next(r for r in row["estimate_vs_dry_run"] if r["component"].startswith("peak"))
            print(f"[{i}/{len(grid)}] {row['label']}: peak {row['peak_bytes'] / 2**30:.2f} GiB traced, "
                  f"{peak['estimate_gib']:.2f} estimated ({peak['error_pct']:+.1f} %), {row['seconds']:.0f} s",
                  flush=True)  # fmt: skip
            rows.append(row)
            rows.sort(key=lambda r: [g[0] for g in grid].index(r["label"]))  # the grid's order
            # written after every setup: an interrupted grid keeps what it traced (``complete`` says so)
            out = {"provenance": {**provenance(cmd), "complete": i == len(grid)}, "runs": rows}
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(rows)} setups in {time.perf_counter() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
