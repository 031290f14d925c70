"""The drills' rows as the chapters show them: one row per drill, headers in words, the weight difference exact.

The drills themselves (a run stopped and resumed, a rank killed) are ``smolfsdp.probes.drills``; this module
only shapes their rows for a reader. Chapters "Debugging the seams" and "Scaling out":

    tables.show(drills_view.drill_table(rows, root=output_dir))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from smolfsdp.book import tables
from smolfsdp.book.tables import difference_text

# a drill row's key -> its header, in the table's column order
DRILL_HEADERS = {
    "strategy": "strategy that ran",
    "steps": "steps",
    "stopped_after": "stopped after step",
    "killed": "killed",
    "first_launch_exit_code": "first launch's exit code",
    "resumed_from": "resumed from (checkpoint)",
    "optimizer_steps": "optimizer steps",
    "tensors": "tensors compared",
    "max_abs_diff": "largest weight difference from the run left alone",
}
# said elsewhere: in the row label (engine, max_restarts), quoted apart (launcher_said), or a folder (reference)
NOT_SHOWN = ("run", "engine", "max_restarts", "launcher_said", "reference")


def _relative(path: str | Path | None, root: str | Path | None) -> str | None:
    """``path`` relative to ``root`` when it lies under it (both resolved: /tmp may be a link), else as given."""
    if path is None or root is None:
        return None if path is None else str(path)
    full, base = Path(path).resolve(), Path(root).resolve()
    return str(full.relative_to(base)) if full.is_relative_to(base) else str(path)


def drill_table(rows: list[dict[str, Any]], root: str | Path | None = None) -> pd.DataFrame:
    """The rows of ``probes.drills.resume_drill`` / ``kill_rank_drill`` shaped for a reader (for ``tables.show``).

    One row per drill, labelled by its ``run``; headers in words (:data:`DRILL_HEADERS`), the checkpoint
    relative to ``root`` (the drills' ``output_dir``: ``drill_native_resumed/checkpoints/step-000003``),
    the weight difference exact (:func:`difference_text`), never rounded to ``0.00``. Keys in
    :data:`NOT_SHOWN` are said elsewhere; any other key gets a column of its own. Raises KeyError
    naming a row without ``run``.
    """
    for i, row in enumerate(rows):
        if "run" not in row:
            raise KeyError(
                f"drill row {i} has no 'run' label: pass rows returned by resume_drill/kill_rank_drill"
            )
    keys = [k for k in DRILL_HEADERS if any(k in r for r in rows)]
    keys += [k for r in rows for k in r if k not in DRILL_HEADERS and k not in NOT_SHOWN and k not in keys]
    out = []
    for row in rows:
        shown = {k: row.get(k) for k in keys}
        if "resumed_from" in shown:
            shown["resumed_from"] = _relative(shown["resumed_from"], root)
        if shown.get("max_abs_diff") is not None:
            shown["max_abs_diff"] = difference_text(shown["max_abs_diff"])
        out.append(shown)
    frame = pd.DataFrame(out, index=pd.Index([r["run"] for r in rows], name="run"))
    return frame.rename(columns={k: DRILL_HEADERS.get(k, tables.readable_name(k)) for k in keys})
