"""Run today's estimator on every published GPU row, and the dry run with the allocator replay on six of them;
write the error tables with their provenance.

    .venv/bin/python scripts/published_check.py            # writes data/results/published/check.json (~1 min)
    .venv/bin/python scripts/published_check.py --print    # the estimator's table only, written nowhere
    .venv/bin/python scripts/published_check.py --calibration  # only data/results/published/calibration.json (~5 s)

Reads data/results/published/rows.json (sources, configurations, published numbers and what they are);
``smolfsdp.audit.published_rows.check_table`` (estimator) and ``smolfsdp.audit.dryrun.published_replay.dry_run_rows`` (dry run +
``smolfsdp.audit.allocator_replay.replay``) do the work; tests/test_published.py holds the written file to today's
code. The book's memory chapter shows the same tables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def provenance() -> dict:
    import transformers

    from smolfsdp.audit.published_rows import ROWS_PATH
    from smolfsdp.estimate.reserved import CUBLAS_WORKSPACE_BYTES, DEFAULT_POOL_FACTOR, REPLAY_GRID

    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    rows = (ROOT / ROWS_PATH).read_bytes()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_sha": sha,
        "rows_sha256": hashlib.sha256(rows).hexdigest(),
        "transformers": transformers.__version__,
        "command": "python scripts/published_check.py",
        "default_pool_factor": DEFAULT_POOL_FACTOR,
        "default_pool_factor_fitted_to": REPLAY_GRID,
        "cublas_workspace_bytes": CUBLAS_WORKSPACE_BYTES,
        "what": "smolfsdp's estimator (no GPU) against numbers published by others; error % = (estimate - "
        "published) / published. dry_run: the fake-tensor dry run of six rows and the caching allocator replayed "
        "on its allocation order (smolfsdp.audit.dryrun.published_replay), traced on a CPU, not measured",
    }


def write_calibration() -> None:
    """The step-time model's rates (smolfsdp.audit.hfu_fit.calibration_record) where the estimator reads them."""
    from smolfsdp.audit.hfu_fit import calibration_record
    from smolfsdp.estimate.calibration import CALIBRATION_PATH

    prov = {k: v for k, v in provenance().items() if not k.startswith(("default_pool", "cublas"))}
    prov["what"] = (
        "the step-time model's MFU and HFU per GPU, fitted to the published rows' tokens/s "
        "(smolfsdp.audit.hfu_fit.calibration_record); read by smolfsdp.estimate.calibration"
    )
    out = ROOT / CALIBRATION_PATH
    out.write_text(json.dumps({"provenance": prov, **calibration_record()}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}", flush=True)


def main(argv=None) -> int:
    """Check every row of rows.json first (one line naming the row and the key, exit 2), then compute and write."""
    from smolfsdp.errors import ConfigError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print", action="store_true", help="print the table, write nothing")
    ap.add_argument("--calibration", action="store_true", help="write only the step-time calibration")
    args = ap.parse_args(argv)
    try:
        return _check(args)
    except ConfigError as err:
        print(f"published_check: error: {err}", file=sys.stderr)
        return 2


def _check(args: argparse.Namespace) -> int:
    from smolfsdp.audit.published_rows import CHECK_PATH, check_table, load_rows

    load_rows()  # every row checked before anything is computed or written
    if not args.print:
        write_calibration()
        if args.calibration:
            return 0
    table = check_table()
    if args.print:
        print(json.dumps(table, indent=1))
        return 0
    from smolfsdp.audit.dryrun.published_replay import dry_run_rows  # deferred: torch, transformers

    dry = dry_run_rows(progress=lambda msg: None)
    for r in dry:
        print(r["id"], {k: r[k]["error_pct"] for k in ("active", "reserved") if k in r}, flush=True)
    out = ROOT / CHECK_PATH
    out.write_text(json.dumps({"provenance": provenance(), **table, "dry_run": dry}, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}: {len(table['memory'])} memory rows, {len(table['mfu'])} MFU rows, "
          f"{len(dry)} dry-run rows")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
