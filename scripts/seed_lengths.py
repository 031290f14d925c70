"""Write data/results/published/seed_lengths.json: row lengths like the seed data set's, with their provenance.

    .venv/bin/python scripts/seed_lengths.py            # writes the file (~10 s)
    .venv/bin/python scripts/seed_lengths.py --print    # prints it, writes nothing

``smolfsdp.estimate.seed_lengths.derive_seed_lengths`` does the derivation from the published pieces it lists
(question-length histogram, file sizes, one row's field lengths, SmolLM3's template, characters per token) and
the assumptions it states; this script adds the bundled tokenizer's characters per token on the bundled rows
(``smolfsdp.book.throughput_views.bundled_chars_per_token``), recorded for comparison. tests/test_token_share.py
holds the written file to today's code. Chapter 01 ("How fast it runs") and scripts/token_efficiency.py read it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the content instead of writing the file")
    args = parser.parse_args(argv)

    from smolfsdp.book.throughput_views import bundled_chars_per_token
    from smolfsdp.estimate.seed_lengths import SEED_LENGTHS_PATH, derive_seed_lengths, sample_lengths
    from smolfsdp.estimate.token_share import packed_share

    bundled = bundled_chars_per_token()
    bundled["use"] = (
        "recorded, not used: the bundled tokenizer is a 1,024-token BPE built for the smoke runs, not SmolLM3's "
        "128,256-token one, so its characters per token would overstate the seed rows' token counts"
    )
    first = derive_seed_lengths(bundled)  # the rows and scenarios, then TRL's BFD over them
    fill = {
        str(n): packed_share(sample_lengths(first["scenarios"]["central"], first["rows"], n), n)
        for n in (2048, 4096)
    }
    text = json.dumps(derive_seed_lengths(bundled, fill), indent=1) + "\n"
    if args.print:
        print(text, end="")
        return 0
    (ROOT / SEED_LENGTHS_PATH).write_text(text)
    print(f"wrote {SEED_LENGTHS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
