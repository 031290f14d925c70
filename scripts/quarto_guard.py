"""Quarto pre-render guard (`project: pre-render` in _quarto.yml): refuse to render in the repository.

Quarto writes each executed .ipynb chapter back over its source and keeps one `_freeze/` whatever -P
says, so rendering in the repository would dirty the committed notebooks and could publish smoke
results as the full profile. `make render PROFILE=smoke|full` (smolfsdp.book.chapters.render_book) renders from
a scratch copy, `_render/<profile>/`, marked by `.smolfsdp-render.json`; this script lets only such a
project render, and only in the Quarto profile it was made for. Standard library only: Quarto runs it
with the first `python` on PATH.
"""

import json
import os
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
STATE = PROJECT / ".smolfsdp-render.json"


def main() -> int:
    if not STATE.is_file():
        sys.stderr.write(
            "smolfsdp: not rendering in the repository: Quarto would write the executed notebooks over "
            "notebooks/*.ipynb and mix profiles in one _freeze/.\n"
            "Render with `make render` (smoke profile, site in _book/smoke/) or "
            "`make render PROFILE=full` (2 GPUs, site in _book/full/).\n"
        )
        return 1
    profile = json.loads(STATE.read_text())["profile"]
    active = [p for p in os.environ.get("QUARTO_PROFILE", "").split(",") if p]
    if active and profile not in active:
        sys.stderr.write(
            f"smolfsdp: {PROJECT} is the scratch project of the {profile!r} profile, but Quarto runs "
            f"with --profile {','.join(active)}; use `make render PROFILE={active[0]}`.\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
