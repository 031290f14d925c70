"""List the code cells of executed chapters that ran longer than a limit, and whether they printed as they ran.

Reads notebooks written by ``scripts/execute_notebooks.py --ipynb-dir DIR`` (nbclient stamps each code cell's
``metadata.execution``: ``iopub.execute_input`` when it started, ``shell.execute_reply`` when it finished).

    python scripts/execute_notebooks.py --profile smoke --chapter 05_profiling --ipynb-dir _executed/smoke
    python scripts/cell_times.py _executed/smoke              # cells over 10 s
    python scripts/cell_times.py _executed/smoke --over 5 --fail   # exit 1 if a long cell is silent

An ``.ipynb`` keeps no time per output, so "silent" is an approximation: a long cell is **silent** when it
printed no stream line at all (only a table, figure or value, which appear when the cell ends), and
**streams** when its first output is a stream (``print``, a progress line: what a cell shows while it
works). A cell that prints only at its very end reads as ``streams`` here; its line count says how much.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

import nbformat


def _stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def cell_times(nb) -> list[dict]:
    """One row per executed code cell: index, first code line, wall seconds, stream lines, whether silent."""
    rows = []
    for i, cell in enumerate(nb.cells):
        ex = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type != "code" or "iopub.execute_input" not in ex or "shell.execute_reply" not in ex:
            continue
        wall = (_stamp(ex["shell.execute_reply"]) - _stamp(ex["iopub.execute_input"])).total_seconds()
        outs = cell.get("outputs", [])
        streams = [o for o in outs if o.get("output_type") == "stream"]
        lines = sum(o.get("text", "").count("\n") for o in streams)
        code = next(
            (ln.strip() for ln in cell.source.splitlines() if ln.strip() and not ln.startswith("#|")), ""
        )
        rows.append({
            "cell": i, "code": code[:60], "wall_s": wall, "stream_lines": lines,
            "silent": not (outs and outs[0].get("output_type") == "stream"),
        })  # fmt: skip
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+", help="executed notebooks, or folders holding them")
    parser.add_argument("--over", type=float, default=10.0, help="seconds: list cells longer than this")
    parser.add_argument("--fail", action="store_true", help="exit 1 when a listed cell is silent")
    args = parser.parse_args(argv)
    files = []
    for p in map(Path, args.paths):
        if not p.exists():
            parser.error(
                f"{p} does not exist: give executed notebooks (execute_notebooks.py --ipynb-dir DIR)"
            )
        files += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    silent = 0
    for f in files:
        rows = [r for r in cell_times(nbformat.read(f, as_version=4)) if r["wall_s"] > args.over]
        for r in rows:
            silent += r["silent"]
            how = "SILENT" if r["silent"] else f"streams ({r['stream_lines']} lines)"
            print(f"{f.stem}  cell {r['cell']:>2}  {r['wall_s']:6.1f} s  {how:<22} {r['code']}")
    return 1 if args.fail and silent else 0


if __name__ == "__main__":
    sys.exit(main())
