"""Token efficiency of the book's recipe: real tokens padded against packed, on the bundled sample and on rows
like the seed data set's. Printed, not timed (nothing here runs a model).

    .venv/bin/python scripts/token_efficiency.py                    # both distributions (~20 s)
    .venv/bin/python scripts/token_efficiency.py --only bundled     # the bundled sample only (~10 s)
    .venv/bin/python scripts/token_efficiency.py --recipe lora_smollm3_3b

For each distribution: rows and real tokens, the real-token share when each micro-batch of 1, 2 or 4 shuffled
rows is padded to its longest row (TRL's collator, ``smolfsdp.train.batches``), the share of packed rows of 2,048
and 4,096 tokens that TRL's best-fit-decreasing packing fills, how many packed rows it makes, and the optimizer
steps of one epoch at the recipe's batch (GPUs x micro-batch x gradient accumulation), padded and packed.
The numbers are ``smolfsdp.book.throughput_views.efficiency_numbers`` (``smolfsdp.estimate.token_share`` on
``bundled_lengths`` and ``seed_training_lengths``), the same the fine-tune chapter shows. The bundled sample is
tokenised by the package (``smolfsdp.data.prepare``) with the bundled tokenizer; the seed-like rows are derived
(``data/results/published/seed_lengths.json`` states the sources and assumptions), not measured.
"""

from __future__ import annotations

import argparse


def report_lines(name: str, e: dict, cfg) -> list[str]:
    """The printed lines of one distribution's numbers ``e`` (``throughput_views.efficiency``)."""
    from smolfsdp.book.throughput_views import MICRO_BATCHES, PACK_LENGTHS

    batch = f"{cfg.nproc} GPUs x {cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps}"
    lines = [f"{name}: {e['rows']:,} training rows, {e['real_tokens']:,} real tokens"]
    for k in MICRO_BATCHES:
        lines.append(
            f"  padded, micro-batch {k}: {100 * e[f'padded_share_mb{k}']:.2f} % of computed tokens real"
        )
    for n in PACK_LENGTHS:
        lines.append(
            f"  packed (TRL BFD) to {n:,}: {e[f'packed_rows_{n}']:,} packed rows, "
            f"{100 * e[f'packed_share_{n}']:.2f} % of their {n:,} tokens real"
        )
    lines.append(
        f"  optimizer steps per epoch at {batch}: {e['steps_padded']:,} padded, {e['steps_packed']:,} packed "
        f"(packed rows of {PACK_LENGTHS[0]:,})"
    )
    return lines


def scenario_lines(cfg) -> list[str]:
    """The seed-like distribution's padding and packing across its three scenarios (central and the two ends
    of what ``seed_lengths.json`` assumes), at the recipe's micro-batch and ``max_length``."""
    from smolfsdp.estimate.seed_lengths import load_seed_lengths, seed_like_lengths
    from smolfsdp.estimate.token_share import packed_share, padded_share

    k, n = cfg.per_device_train_batch_size, cfg.max_length
    lines = [f"  seed-like scenarios (micro-batch {k}, packed to {n:,}):"]
    for name in load_seed_lengths()["scenarios"]:
        rows = seed_like_lengths(n, name)
        rows = rows[: len(rows) - int(cfg.eval_size)]
        lines.append(
            f"    {name}: padded {100 * padded_share(rows, k, cfg.seed):.1f} % real, "
            f"packed {100 * packed_share(rows, n):.1f} % real"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--recipe", default="smollm3_3b_medical", help="a recipe of configs/runs/ (its batch)"
    )
    parser.add_argument("--only", choices=("bundled", "seed"), help="one distribution only")
    args = parser.parse_args(argv)

    from smolfsdp.book import throughput_views as tv
    from smolfsdp.config import load_config
    from smolfsdp.paths import recipe

    cfg = load_config(recipe(args.recipe))
    names = {"bundled": [tv.BUNDLED], "seed": [tv.SEED_LIKE], None: [tv.BUNDLED, tv.SEED_LIKE]}[args.only]
    print(f"token efficiency of configs/runs/{args.recipe}.yaml (estimated from row lengths; nothing timed)")
    for name in names:
        by_length = {n: tv.distributions(args.recipe, n)[name] for n in tv.PACK_LENGTHS}
        print("\n".join(report_lines(name, tv.efficiency(by_length, cfg, cfg.seed), cfg)))
        if name == tv.SEED_LIKE:
            print("\n".join(scenario_lines(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
