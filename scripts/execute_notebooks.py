"""Execute every chapter listed in _quarto.yml in one profile and write HTML (no Quarto needed).

python scripts/execute_notebooks.py --profile smoke --html-dir _book_html
"""

import argparse
import sys
import time

from smolfsdp.book import chapters, execute_chapter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="smoke", choices=["smoke", "full"])
    parser.add_argument("--html-dir", default="_book_html")
    args = parser.parse_args()
    for nb in chapters():
        t0 = time.time()
        execute_chapter(nb, args.profile, args.html_dir)
        print(
            f"{nb.name}: executed in {time.time() - t0:.0f} s -> {args.html_dir}/{nb.stem}.html", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
