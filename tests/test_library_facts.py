"""Sentences the chapters once got wrong against the libraries' source (issue 41), each held to the library
line or the package number that decides it, so the wrong sentence cannot come back:

* the Trainer/accelerate run FSDP accumulation under ``no_sync`` unless ``sync_each_batch`` (chapters 02, 07);
* FSDP2's forward prefetching is implicit and its backward prefetching explicit (chapters 02, 03);
* FSDP1's ``FULL_SHARD`` is FSDP2's *default* ``reshard_after_forward`` (None), not True everywhere (chapter 03);
* activation checkpointing recomputes 74-76 % of a forward, not "each layer's forward twice" (chapter 05);
* the prose under the mechanics timelines names the palette's colour for compute blocks (chapter 02).
"""

import inspect
import json
import re

import pytest
from accelerate.utils import GradientAccumulationPlugin
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fsdp_state
from transformers import Trainer

from smolfsdp.audit.seeds.installed_stack import source_line
from smolfsdp.book import dryrun_views, library_facts, probe_views
from smolfsdp.book.figures import mechanisms as fm
from smolfsdp.book.figures import palette
from smolfsdp.config import TrainConfig
from smolfsdp.estimate.recompute import recompute_share
from smolfsdp.paths import repo_root
from smolfsdp.train import trl_engine


def chapter_text(stem: str) -> str:
    """Every cell's source of a chapter, joined (markdown and code: generated prose is called from code)."""
    nb = json.loads((repo_root() / "notebooks" / f"{stem}.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"])


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_trainer_accumulates_fsdp_under_no_sync_unless_sync_each_batch():
    """transformers' training loop: every micro-batch but the last runs under ``accelerator.no_sync`` unless the
    plugin's ``sync_each_batch`` (default False) is set; accelerate's ``no_sync`` is FSDP2's
    ``set_requires_gradient_sync(False)`` or FSDP1's ``model.no_sync``."""
    assert GradientAccumulationPlugin().sync_each_batch is False
    loop = inspect.getsource(Trainer._run_epoch)  # the micro-batch loop (transformers 5.24)
    test = loop.index('plugin_kwargs.get("sync_each_batch", False)')
    assert (
        test
        < loop.index("sync_context = contextlib.nullcontext")
        < loop.index("functools.partial(self.accelerator.no_sync, model=model)")
    )
    from accelerate import Accelerator

    no_sync = inspect.getsource(Accelerator.no_sync)
    assert "model.set_requires_gradient_sync(False)" in no_sync and 'getattr(model, "no_sync"' in no_sync
    # what this package's TRL engine asks instead, and the one case it leaves under no_sync
    base = dict(engine="trl", fsdp_version=1, gradient_accumulation_steps=4)
    assert not trl_engine.accumulates_under_no_sync(TrainConfig(**base))
    assert trl_engine.accumulates_under_no_sync(TrainConfig(**base, cpu_offload=True))


def test_chapters_say_who_skips_the_reduction():
    said = flat(library_facts.accumulation_markdown())
    cites = {k: source_line(*v) for k, v in library_facts.ACCUMULATION_LINES.items()}
    for ref in cites.values():
        assert f"`{ref}`" in said
    assert "Trainer runs every micro-batch but the last under `accelerator.no_sync(model)`" in said
    assert "leaves it `False`" in said and "accumulates every FSDP run's gradients unsharded" in said
    assert "smolfsdp's TRL engine asks for `sync_each_batch=True`" in said
    ch02, ch07 = flat(chapter_text("02_fsdp_mechanics")), flat(chapter_text("07_scaling"))
    assert "library_facts.accumulation_markdown()" in ch02
    # the wrong sentences: the Trainer only under CPU offload; FSDP "reduces every micro-batch unless told otherwise"
    assert "Trainer does it under FSDP1 CPU offload" not in ch02
    assert "the FSDP strategies gather and reduce for every micro-batch unless told otherwise" not in ch07
    assert "under `no_sync()` by default, for DDP and FSDP alike" in ch07
    readme = flat((repo_root() / "README.md").read_text())
    assert "which the Trainer and accelerate do by default for every micro-batch but the last" in readme


def test_fsdp2_prefetches_forward_implicitly_and_backward_explicitly():
    """torch 2.13's own words and code: forward prefetching is implicit (a separate all-gather stream), the
    default backward prefetch is explicit (the pre-backward hook issues the previous unit's all-gather, by the
    reverse post-forward order) unless ``set_modules_to_backward_prefetch`` named modules."""
    group = inspect.getsource(_fsdp_param_group)
    assert "For implicit forward prefetching" in group and "Post-forward order for explicit backward" in group
    backward = inspect.getsource(_fsdp_state.FSDPState._pre_backward)
    assert "default_prefetch = len(self._states_to_backward_prefetch) == 0" in backward
    assert '_prefetch_unshard(target, "backward")' in inspect.getsource(
        _fsdp_param_group.FSDPParamGroup._backward_prefetch
    )
    said = flat(library_facts.prefetch_markdown())
    assert (
        "**Forward prefetching is implicit**" in said
        and "**Backward prefetching is explicit, and on by default**" in said
    )
    for module, text in library_facts.PREFETCH_LINES.values():
        assert f"`{source_line(module, text).rsplit('/', 1)[-1]}`" in said
    ch02, ch03 = flat(chapter_text("02_fsdp_mechanics")), flat(chapter_text("03_fsdp1_vs_fsdp2"))
    assert "library_facts.prefetch_markdown()" in ch02
    assert "prefetches implicitly in backward only" not in ch02
    assert "implicit prefetch in backward" not in ch03
    row = next(
        ln for ln in chapter_text("03_fsdp1_vs_fsdp2").splitlines() if ln.startswith("| `backward_prefetch=")
    )
    assert "explicitly, in reverse forward order" in row
    row = next(
        ln for ln in chapter_text("03_fsdp1_vs_fsdp2").splitlines() if ln.startswith("| `forward_prefetch=")
    )
    assert "forward prefetching is implicit" in row


def test_full_shard_maps_to_fully_shards_default():
    """``fully_shard(reshard_after_forward=None)``: True for non-root modules, False for the root (torch's
    docstring and ``FSDPState._lazy_init``), as FSDP1's ``FULL_SHARD`` keeps its root gathered after forward
    (``_runtime_utils._post_forward_reshard``). True everywhere would reshard the root too: one more all-gather."""
    assert inspect.signature(fully_shard).parameters["reshard_after_forward"].default is None
    doc = flat(inspect.getdoc(fully_shard))
    assert "If ``None``, it is set to ``True`` for non-root modules and ``False`` for root modules." in doc
    source_line(f"{library_facts._FSDP2}._fsdp_state", "if self._auto_reshard_after_forward:")
    source_line(
        "torch.distributed.fsdp._runtime_utils", "Do not free the root's parameters in the post-forward"
    )
    row = next(
        ln
        for ln in chapter_text("03_fsdp1_vs_fsdp2").splitlines()
        if ln.startswith("| `sharding_strategy=FULL_SHARD`")
    )
    assert "`reshard_after_forward` left at its default `None`" in row and "`False` for the root" in row
    assert "reshard_after_forward=True)`" not in row


@pytest.mark.parametrize("where", ["notebooks", "src/smolfsdp", "README.md", "index.qmd"])
def test_no_page_says_each_layers_forward_runs_twice(where):
    root = repo_root() / where
    files = [root] if root.is_file() else [*root.rglob("*.py"), *root.rglob("*.ipynb")]
    for f in files:
        assert not re.search(r"layer's forward runs\s+(\"\s*\n\s*\")?twice", f.read_text()), f


def test_the_dry_run_reading_says_the_recompute_share_it_computes():
    grid = dryrun_views.load_grid()
    if grid is None:
        pytest.skip("data/results/dryrun/grid.json is absent")
    said = dryrun_views.flops_reading(grid)
    full = recompute_share("HuggingFaceTB/SmolLM3-3B", "full", seq_len=2048)["of_forward"]
    assert 0.73 < full < 0.75  # torch's checkpoint stops before down_proj: not a whole forward
    assert f"recomputes {full:.0%} to " in said and "not the whole forward" in said and "twice" not in said


def test_timeline_prose_names_the_palettes_compute_colour():
    """The blocks where a unit computes are drawn in ``palette.TRACE_CATEGORY["compute"]`` (teal); the sentences
    under the timelines read its word from the palette (the wrong one said grey)."""
    compute = palette.TRACE_CATEGORY["compute"]
    events = [
        {"kind": "phase", "name": "forward", "start_us": 0, "dur_us": 100},
        {"kind": "annotation", "name": "FSDP::pre_forward (model.layers.0)", "unit": "model.layers.0", "start_us": 1, "dur_us": 2},
        {"kind": "annotation", "name": "FSDP::post_forward (model.layers.0)", "unit": "model.layers.0", "start_us": 50, "dur_us": 2},
        {"kind": "all-gather", "name": "ag", "start_us": 1, "dur_us": 1},
    ]  # fmt: skip
    fig = fm.plot_step_timeline(events)
    assert any(t.name == "the unit computes" and t.marker.color == compute for t in fig.data)
    word = palette.word(compute)
    assert f"{word} block" in probe_views.prefetch_reading() and f"{word} where the unit computes" in (
        probe_views.timeline_colours_sentence()
    )
    ch02 = chapter_text("02_fsdp_mechanics")
    assert "probe_views.prefetch_reading()" in ch02 and "probe_views.timeline_colours_sentence()" in ch02
    assert "grey block" not in ch02 and "teal where" not in ch02  # no colour typed by hand
