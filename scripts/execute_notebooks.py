"""Execute the chapters listed in _quarto.yml (all, or those named) in one profile and write HTML
(no Quarto needed; `make book`). The profile is injected through papermill as `quarto render -P` does;
the notebooks on disk are never written. A bar per chapter shows which cell is running. The HTML is an execution check, not the book: render that
with `make render` (Quarto), or read the published site.

python scripts/execute_notebooks.py --profile smoke --html-dir _book_html
python scripts/execute_notebooks.py --chapter 05_profiling --chapter notebooks/07_scaling.ipynb
python scripts/execute_notebooks.py --ipynb-dir _executed/smoke   # then: render_book.py --executed _executed/smoke

--ipynb-dir also writes each executed notebook (<stem>.ipynb, outputs and injected parameters in it): what
`scripts/render_book.py --executed DIR` renders with Quarto without executing anything again.
"""

import argparse
import sys
import time
from pathlib import Path

import nbformat

from smolfsdp.book.chapters import execute_chapter, select_chapters
from smolfsdp.errors import ConfigError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile",
        default="smoke",
        choices=["smoke", "full"],
        help="per-cell time limit: 900 s in smoke, none in full (smolfsdp.book.chapters.CELL_TIMEOUT_S)",
    )
    parser.add_argument("--html-dir", default="_book_html")
    parser.add_argument(
        "--chapter",
        action="append",
        default=[],
        metavar="NAME",
        help="a chapter to run, by stem (05_profiling) or path (notebooks/05_profiling.ipynb); "
        "repeat for several (run in book order); default: every chapter",
    )
    parser.add_argument("--ipynb-dir", help="also write each executed notebook there, as <stem>.ipynb")
    args = parser.parse_args(argv)
    try:
        selected = select_chapters(args.chapter)
    except ConfigError as e:
        parser.error(str(e))
    for nb in selected:
        t0 = time.time()
        done = execute_chapter(nb, args.profile, args.html_dir, progress=True)
        if args.ipynb_dir:
            Path(args.ipynb_dir).mkdir(parents=True, exist_ok=True)
            nbformat.write(done, Path(args.ipynb_dir) / nb.name)
        print(
            f"{nb.name}: executed in {time.time() - t0:.0f} s -> {args.html_dir}/{nb.stem}.html", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
