"""The caching-allocator replay (smolfsdp.audit.allocator_replay) and the allocation order the dry run records."""

from __future__ import annotations

import json

import pytest

from smolfsdp.audit import allocator_replay as A
from smolfsdp.paths import repo_root

MIB = 2**20
GIB = 2**30


def test_sizes_round_and_segments_follow_the_allocator_constants():
    assert A.round_size(1) == 512 and A.round_size(513) == 1024 and A.round_size(1024) == 1024
    assert A.allocation_size(1 * MIB) == 2 * MIB  # small: a 2 MiB segment
    assert A.allocation_size(1 * MIB + 512) == 20 * MIB  # 1-10 MiB: a 20 MiB segment
    assert A.allocation_size(10 * MIB) == 10 * MIB  # from 10 MiB: rounded up to 2 MiB
    assert A.allocation_size(11 * MIB + 1) == 12 * MIB


def test_small_requests_pack_into_one_2_mib_segment_and_large_ones_split_20_mib():
    a = A.CachingAllocator()
    for i in range(4):
        a.malloc(("s", i), 100_000)  # 100 kB each -> 100352 bytes rounded, one 2 MiB segment
    assert a.segments == 1 and a.reserved == 2 * MIB and a.allocated == 4 * 100_352
    a.malloc("m1", 3 * MIB)
    a.malloc("m2", 3 * MIB)  # the 20 MiB segment's remainder (17 MiB) is split and reused
    assert a.segments == 2 and a.reserved == 22 * MIB


def test_unsplit_remainder_of_at_most_1_mib_is_handed_out_whole():
    a = A.CachingAllocator()
    a.malloc("x", 11 * MIB + 1)  # a 12 MiB segment; the 1 MiB - 512 B rest is not split off (large pool)
    assert a.allocated == 12 * MIB and a.requested == 11 * MIB + 1


def test_best_fit_and_merge_of_free_neighbours():
    a = A.CachingAllocator()
    a.malloc("big", 100 * MIB)
    a.free("big")
    a.malloc("p", 30 * MIB)
    a.malloc("q", 30 * MIB)  # both carved from the cached 100 MiB block: no new segment
    assert a.segments == 1
    a.free("p")
    a.free("q")  # p, q and the tail merge back into one 100 MiB block
    a.malloc("whole", 100 * MIB)
    assert a.segments == 1 and a.peak_reserved == 100 * MIB


def test_fragmentation_needs_a_new_segment_though_enough_bytes_are_free():
    a = A.CachingAllocator()
    for i in range(4):
        a.malloc(i, 50 * MIB)
    a.free(0)
    a.free(2)  # 100 MiB free, in two 50 MiB holes of different segments
    a.malloc("wide", 60 * MIB)
    assert a.reserved == 260 * MIB and a.allocated == 160 * MIB


def test_a_freed_block_serves_only_its_own_stream():
    a = A.CachingAllocator()
    a.malloc("x", 50 * MIB, stream=1)
    a.free("x")
    a.malloc("y", 50 * MIB, stream=0)
    assert a.reserved == 100 * MIB
    a.malloc("z", 50 * MIB, stream=1)
    assert a.reserved == 100 * MIB


def test_capacity_releases_unsplit_cached_segments_then_runs_out():
    a = A.CachingAllocator(capacity_bytes=100 * MIB)
    a.malloc("a", 60 * MIB)
    a.free("a")
    a.malloc("b", 80 * MIB)  # 60 cached + 80 > 100: the cache is released, then it fits
    assert a.retries == 1 and a.reserved == 80 * MIB
    with pytest.raises(A.OutOfMemory):
        a.malloc("c", 40 * MIB)


def _events(*steps):
    """A setup (one parameter, two optimizer-state tensors) and one step."""
    setup = [("p", "setup"), ("a", 0, 100 * MIB, "PARAM", 0), ("a", 1, 100 * MIB, "OPT", 0),
             ("a", 2, 100 * MIB, "OPT", 0)]  # fmt: skip
    return setup + [("p", "forward"), *steps]


def test_replay_makes_adamw_state_lazily_in_the_first_step():
    step = [("a", 10, 300 * MIB, "ACT", 0), ("f", 10), ("p", "optimizer"), ("a", 11, 30 * MIB, "OPT", 0),
            ("f", 11)]  # fmt: skip
    lazy = A.replay(_events(*step), steps=2)
    eager = A.replay(_events(*step), steps=2, lazy_optimizer_state=False)
    # eager: 300 MiB of state and parameter, then 300 MiB of activation beside them
    assert eager["reserved_by_step"] == [600 * MIB, 600 * MIB]
    # lazy: the state is carved out of the activation's cached 300 MiB in step 1; step 2 needs a new segment
    assert lazy["reserved_by_step"] == [400 * MIB, 700 * MIB]
    assert lazy["requested_by_step"][1] == eager["requested_by_step"][1] == 600 * MIB


def test_replay_holds_a_record_stream_block_until_the_next_one_and_skips_lazy_init_after_step_one():
    step = [("lazy", 1), ("a", 9, 64 * MIB, "ACT", 0), ("f", 9), ("lazy", 0),
            ("a", 10, 50 * MIB, "PARAM", 1), ("r", 10, 0), ("f", 10),
            ("a", 11, 50 * MIB, "PARAM", 1), ("r", 11, 0), ("f", 11), ("a", 12, 50 * MIB, "ACT", 0), ("f", 12)]  # fmt: skip
    held = A.replay(_events(*step), steps=2, lazy_optimizer_state=False)
    free = A.replay(_events(*step), steps=2, lazy_optimizer_state=False, record_stream=False)
    assert held["peak_active"] == 300 * MIB + 100 * MIB  # block 10 still held when 11 is allocated
    assert held["peak_allocated"] == free["peak_allocated"] == 300 * MIB + 64 * MIB  # step 1's lazy init
    assert held["allocated_by_step"][1] == 300 * MIB + 50 * MIB  # a held block is no longer allocated
    assert free["peak_active"] == 300 * MIB + 64 * MIB  # freed at once: one block at a time
    one_pool = A.replay(_events(*step), steps=2, lazy_optimizer_state=False, streams=False)
    assert one_pool["reserved_by_step"][1] < held["reserved_by_step"][1]


def test_held_blocks_survive_one_pool_and_are_freed_before_the_cache_is_released():
    """A block recorded on another stream stays held with ``streams=False`` too (its own stream is the event's);
    at capacity the held blocks are freed first, as the allocator syncs its events before giving memory back."""
    step = [("a", 10, 50 * MIB, "PARAM", 1), ("r", 10, 0), ("f", 10), ("a", 11, 50 * MIB, "PARAM", 1),
            ("r", 11, 0), ("f", 11)]  # fmt: skip
    one_pool = A.replay(_events(*step), steps=1, lazy_optimizer_state=False, streams=False)
    assert one_pool["peak_active"] == 400 * MIB
    roomy = A.replay(_events(*step), steps=1, lazy_optimizer_state=False)
    assert roomy["peak_reserved"] == 400 * MIB
    squeezed = A.replay(_events(*step), steps=1, lazy_optimizer_state=False, capacity_bytes=350 * MIB)
    assert squeezed["retries"] == 1 and squeezed["peak_reserved"] == 350 * MIB


def test_replay_moves_the_reduce_scatter_input_to_the_reduce_scatter_stream():
    step = [("a", 20, 40 * MIB, "TEMP", 0), ("c", 20, "REDUCE_SCATTER"), ("a", 21, 5 * MIB, "TEMP", 2),
            ("c", 21, "SHARDED_GRAD"), ("f", 20)]  # fmt: skip
    moved = A._rs_input_on_rs_stream(_events(*step, ("a", 20, 40 * MIB, "TEMP", 0)))  # reused after its "c"
    assert [e[4] for e in moved if e[0] == "a" and e[1] == 20] == [2, 2]
    assert A._rs_input_on_rs_stream(_events(("a", 5, MIB, "ACT", 0))) == _events(("a", 5, MIB, "ACT", 0))


@pytest.mark.parametrize("fsdp_version", [1, 2])
def test_dry_run_records_an_order_whose_replay_reproduces_its_peak(fsdp_version):
    """The recorded allocation order is complete: replayed eagerly with no delays, the tensor bytes it holds
    peak exactly at the dry run's traced peak; FSDP's all-gather and reduce-scatter work is on other streams."""
    from smolfsdp.audit.dryrun.dry_run import dry_run
    from smolfsdp.config import load_config

    cfg = load_config(repo_root() / "configs/runs/smoke.yaml", fsdp_version=fsdp_version, nproc=2,
                      activation_checkpointing=True, max_length=64)  # fmt: skip
    report = dry_run(cfg, 2, progress=lambda m: None)
    ev = report.alloc_events
    out = A.replay(ev, steps=2, lazy_optimizer_state=False, record_stream=False)
    assert out["requested_by_step"] == [report.peak_bytes, report.peak_bytes]
    assert {e[4] for e in ev if e[0] == "a"} >= {0, 1, 2}  # default, then FSDP's own streams
    assert ("lazy", 1) in ev and ("lazy", 0) in ev
    if fsdp_version == 1:  # FSDP1's record_stream calls reach the log
        assert any(e[0] == "r" for e in ev)
    full = A.replay(ev)
    assert full["peak_reserved"] >= full["peak_allocated"] >= report.peak_bytes
    assert "alloc_events" not in report.to_dict()
    if fsdp_version == 2:  # what `smolfsdp dryrun --gpu` says, from the replay at the card's capacity
        _fit_verdicts(report, full)


def _fit_verdicts(report, full):
    from smolfsdp.cli_dryrun import fit_on_gpu, format_dryrun
    from smolfsdp.estimate.hardware import get_gpu

    outside = fit_on_gpu(report, get_gpu("H100 SXM"))["outside_allocator_gib"] * GIB
    roomy = get_gpu(None, memory_gib=(full["peak_reserved"] + outside) / GIB + 0.01)
    assert fit_on_gpu(report, roomy)["verdict"] == "fits"
    # room for the fullest moment's blocks but not for everything it cached: it gives back its cache and retries
    assert full["peak_reserved"] > full["peak_allocated"]
    between = get_gpu(None, memory_gib=(full["peak_allocated"] + outside) / GIB)
    assert fit_on_gpu(report, between)["verdict"] in ("tight", "does not fit")
    small = get_gpu(None, memory_gib=(report.peak_bytes + outside) / GIB / 2)
    assert fit_on_gpu(report, small)["verdict"] == "does not fit"
    text = format_dryrun(report, __import__("pandas").DataFrame({"component": ["peak"]}), roomy)
    reserved = (full["peak_reserved"] + 32 * 2**20) / GIB
    assert (
        f"on a real GPU ~{reserved:,.2f} GiB reserved" in text and ": fits, by the allocator replayed" in text
    )


def test_committed_dry_run_rows_are_within_the_issue_tolerance():
    """data/results/published/check.json's dry_run rows (scripts/published_check.py): the dry run plus the
    allocator replay against torchtitan's published reserved (10 %) and active (5 %) memory, six rows."""
    rows = json.loads((repo_root() / "data/results/published/check.json").read_text())["dry_run"]
    assert len(rows) == 6
    for r in rows:
        for what in ("reserved", "active"):
            if what in r:
                assert r[what]["within_tolerance"] and abs(r[what]["error_pct"]) <= (
                    10 if what == "reserved" else 5
                )
    assert sum("reserved" in r for r in rows) == 6 and sum("active" in r for r in rows) == 4


def test_one_published_row_re_traced_and_replayed_equals_the_committed_row():
    from smolfsdp.audit.dryrun.published_replay import dry_run_row, rows_by_id

    committed = {
        r["id"]: r
        for r in json.loads((repo_root() / "data/results/published/check.json").read_text())["dry_run"]
    }
    rid = "torchtitan/pr165-7b-fsdp2-ac"
    got = dry_run_row(rows_by_id()[rid])
    for key in ("dry_run_peak_gib", "active", "reserved"):
        assert got[key] == committed[rid][key], key
    assert got["replay"]["reserved_by_step_gib"] == committed[rid]["replay"]["reserved_by_step_gib"]


def test_book_views_of_the_allocator_section():
    """Chapter 00's allocator section reads check.json and rows.json: a table that fits the page, sentences counted
    from it, the published ratios one factor would have to cover, the figure's four series."""
    from smolfsdp.book import allocator_views

    check = allocator_views.load_check()
    table = allocator_views.reserved_table(check)
    assert len(table) == 6 and len(table.columns) <= 7
    assert (table["replay %"].abs() <= 10).all() and (table["estimate %"].abs() <= 10).all()
    assert "the replayed allocator on 6 of 6" in allocator_views.reading(check)
    assert allocator_views.published_ratios_text() == (
        "fsdp_qlora: 1.12 to 1.24 x (2 runs); torchtitan: 1.20 to 1.36 x (4 runs)"
    )
    fig = allocator_views.plot_reserved(check)
    assert [t.name for t in fig.data][-1] == "published reserved" and len(fig.data) == 4
