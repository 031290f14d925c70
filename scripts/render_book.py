"""Render the book with Quarto in one profile, from a scratch copy, so the committed notebooks stay clean.

    python scripts/render_book.py --profile smoke    # `make render`: site in _book/smoke/
    python scripts/render_book.py --profile full     # `make render PROFILE=full`, on 2 GPUs: _book/full/

What it does and why: smolfsdp.book.chapters.render_book (Quarto writes executed .ipynb chapters over their
sources and `freeze: auto` ignores -P, so each profile renders in its own _render/<profile>/).
"""

import argparse
import subprocess
import sys

from smolfsdp.book.chapters import PROFILES, render_book


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="smoke", choices=PROFILES)
    parser.add_argument("--quarto", default="quarto", help="the Quarto executable (default: quarto on PATH)")
    args = parser.parse_args(argv)
    try:
        site = render_book(args.profile, quarto=args.quarto)
    except FileNotFoundError as e:
        parser.exit(2, f"error: {e}\n")
    except subprocess.CalledProcessError as e:
        parser.exit(
            e.returncode or 1, f"error: quarto render failed in _render/{args.profile}/ (see above)\n"
        )
    print(f"{args.profile} profile rendered: {site}/index.html", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
