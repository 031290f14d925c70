"""smolfsdp.estimate.token_share (padded vs packed real-token share) and the seed-like lengths it is run on."""

import json
import math
import random

import pytest

from smolfsdp.book.full_budget import optimizer_steps
from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.estimate import seed_lengths as sl
from smolfsdp.estimate.token_share import (
    pack_lengths,
    packed_rows,
    packed_share,
    padded_batches,
    padded_share,
    padded_tokens,
    steps_per_epoch,
)
from smolfsdp.paths import recipe, repo_root


def test_padded_share_exact_small_cases():
    assert padded_share([7, 3, 5], 1) == 1.0  # a row alone is never padded
    assert padded_share([4, 4, 4, 4], 2) == 1.0  # equal rows need no padding
    assert padded_share([1, 3], 2) == 4 / 6  # one micro-batch padded to 3: 2 pad tokens
    assert padded_share([1, 3, 5, 7], 4) == 16 / 28
    # the last micro-batch keeps what is left: 3 rows in micro-batches of 2 -> one of 2 and one of 1
    assert sorted(map(len, padded_batches([2, 9, 4], 2))) == [1, 2]


def test_padded_tokens_follow_the_seeded_order():
    lengths = [5, 3, 2, 8, 6, 1]
    for seed in (0, 1, 7):
        order = list(lengths)
        random.Random(seed).shuffle(order)
        expected = sum(len(order[i : i + 2]) * max(order[i : i + 2]) for i in range(0, 6, 2))
        assert padded_tokens(lengths, 2, seed) == expected
        assert padded_share(lengths, 2, seed) == sum(lengths) / expected
    assert padded_batches(lengths, 2, 0) == padded_batches(lengths, 2, 0)  # same seed, same micro-batches


def test_packing_is_trls_bfd():
    # TRL's own pack_dataset docstring example (strategy "bfd"): the 5-token row is cut to 4
    assert pack_lengths([5, 2, 3, 1], 4) == [[4], [3, 1], [2]]
    assert packed_rows([5, 2, 3, 1], 4) == 3
    assert packed_share([5, 2, 3, 1], 4) == (4 + 3 + 1 + 2) / (3 * 4)
    # best fit decreasing: 10 alone, then 9+1, 8+2, 7+3, 6+4, and 5 alone
    assert pack_lengths(list(range(1, 11)), 10) == [[10], [9, 1], [8, 2], [7, 3], [6, 4], [5]]
    assert packed_share(list(range(1, 11)), 10) == 55 / 60


def test_packing_goes_1000_rows_at_a_time_like_sft_trainer():
    # Dataset.map's default batch of 1,000 rows: 1,001 rows of 1 token fill one packed row of 1,000 and leave
    # the 1,001st alone in a second, although one row of 2,000 could hold them all
    assert [sum(b) for b in pack_lengths([1] * 1001, 2000)] == [1000, 1]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: padded_share([], 2), "no rows"),
        (lambda: padded_share([3, 0], 2), "row 1 has length 0"),
        (lambda: padded_share([3, 2.5], 2), "row 1 has length 2.5"),
        (lambda: padded_share([3], 0), "micro_batch=0"),
        (lambda: packed_share([3], 0), "max_length=0"),
        (lambda: steps_per_epoch(10, n_gpus=2, micro_batch=2, gradient_accumulation_steps=0), "gradient_acc"),
    ],
)
def test_bad_input_is_one_config_error(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_steps_per_epoch_is_the_budgets_rule():
    cfg = load_config(recipe("smollm3_3b_medical"))
    rows = cfg.max_rows - cfg.eval_size
    batch = dict(n_gpus=2, micro_batch=2, gradient_accumulation_steps=8)
    unpacked = cfg.replace(packing=False)  # the recipe packs; its rows unpacked make a step per 32 rows
    assert steps_per_epoch(rows, **batch) == optimizer_steps(unpacked) == math.ceil(19_800 / 32) == 619
    assert steps_per_epoch(32, **batch) == 1 and steps_per_epoch(33, **batch) == 2


# ---------------------------------------------------------------------------- the seed-like lengths
def test_committed_seed_lengths_equal_todays_derivation():
    committed = json.loads((repo_root() / sl.SEED_LENGTHS_PATH).read_text())
    derived = json.loads(json.dumps(sl.derive_seed_lengths(committed["bundled"], committed["packed_fill"])))
    assert committed == derived, "run `python scripts/seed_lengths.py` and commit the file"


def test_fit_lognormal_recovers_a_known_distribution():
    edges = list(range(50, 750, 50))
    mu, sigma = 5.5, 0.6
    cdf = [0.0] + [0.5 * (1 + math.erf((math.log(e) - mu) / (sigma * math.sqrt(2)))) for e in edges] + [1.0]
    counts = [round(1e6 * (b - a)) for a, b in zip(cdf, cdf[1:], strict=False)]
    assert sl.fit_lognormal(edges, counts) == (mu, sigma)


def test_template_tokens_count_smollm3s_fixed_text_and_specials():
    # 1,369 rendered characters less the 12-character question, the published date swapped for the pinned one,
    # the think wrap and the closing newline added, the 4 special tokens' text taken out
    text = 1369 - 12 - len("04 September 2026") + len("01 June 2025") + 19 - 3 * 12 - 10
    assert text == 1325
    assert sl.template_tokens(4.0) == round(5 + text / 4.0, 1)


def test_seed_like_rows_are_cut_at_max_length_and_seeded():
    data = sl.load_seed_lengths()
    at_2048 = sl.seed_like_lengths(2048)
    assert at_2048 == sl.seed_like_lengths(2048)  # seed 0 both times
    assert len(at_2048) == data["summary_at_2048"]["central"]["rows"] <= data["rows"] == 19_688
    assert max(at_2048) == 2048 and min(at_2048) > sl.template_tokens(4.0)
    assert round(sum(at_2048) / len(at_2048), 1) == data["summary_at_2048"]["central"]["mean_tokens"]
    at_4096 = sl.seed_like_lengths(4096)
    assert max(at_4096) > 2048 and sum(at_4096) > sum(at_2048)  # the rows cut at 2,048 keep their reasoning
    with pytest.raises(ConfigError, match="scenario 'tight'"):
        sl.seed_like_lengths(2048, "tight")


def test_committed_packed_fill_is_trls_bfd_today():
    """The time model reads the packed fill without importing TRL: the committed number is TRL's BFD over the
    seed-like rows, recomputed here."""
    for n in (2048, 4096):
        assert sl.packed_fill(n) == pytest.approx(packed_share(sl.seed_like_lengths(n), n), abs=1e-12)
    assert sl.packed_fill(1234) is None
