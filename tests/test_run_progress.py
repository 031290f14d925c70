"""A captured run still shows its progress while it goes on (issue 33: chapter 04's training cells were
silent for minutes in Jupyter): ``runner.run(cfg, capture=True, progress=...)``, on by default in a Jupyter kernel;
what it shows is fit for a book page (``launch.progress``: no third-party warning line, no absolute path)."""

import subprocess
import sys
import time

import pytest
from test_notebooks import machine_paths  # noqa: I001 (tests/ on sys.path): the pages' own check

from smolfsdp.config import load_config
from smolfsdp.launch import runner
from smolfsdp.launch.progress import page_line
from smolfsdp.paths import recipe, repo_root
from smolfsdp.quiet import third_party_warning_lines


def test_rank0_progress_passes_rank0_lines_and_a_bar_every_few_seconds():
    said, now = [], [0.0]
    on_line = runner.rank0_progress(said.append, every_s=10.0, clock=lambda: now[0])
    bar = "train:  {}%|███▎      | {}/3 [00:01<00:02,  1.14it/s, loss=6.944]"
    for t, line in [
        (0, "[rank0] 10:16:00 smolfsdp.train.native: building model tiny"),
        (0, "[rank1] 10:16:00 smolfsdp.train.native: building model tiny"),  # another rank: log only
        (0, "W1203 some library warning"),  # not ours: log only
        (1, bar.format(0, 0)),
        (2, bar.format(33, 1)),  # 1 s after the last bar shown: skipped
        (12, bar.format(66, 2)),
        (13, bar.format(100, 3)),  # the end of a bar is always shown
        (
            13,
            bar.format(100, 3).replace("1.14it/s", "1.20it/s"),
        ),  # tqdm's close draws it again: once is enough
        (13, "[rank1]: " + bar.format(100, 3)),
    ]:
        now[0] = t
        on_line(line)
    assert said == [
        "[rank0] 10:16:00 smolfsdp.train.native: building model tiny",
        bar.format(0, 0),
        bar.format(66, 2),
        bar.format(100, 3),
    ]


def test_lines_arrive_while_the_run_goes_on_and_the_log_is_still_captured(tmp_path):
    """A 3-step run of the tiny smoke model on 2 gloo ranks (about 50 s on 2 busy cores, most of it torch's
    start-up in each rank): rank 0's first line comes seconds before the run returns, not with it."""
    cfg = load_config(recipe("smoke"), output_dir=str(tmp_path), name="progress", overwrite=True, max_steps=3,
                      eval_steps=0, save_steps=0)  # fmt: skip
    seen: list[tuple[float, str]] = []
    run = runner.run(
        cfg, capture=True, progress=runner.rank0_progress(lambda s: seen.append((time.monotonic(), s)))
    )
    done = time.monotonic()
    texts = [s for _, s in seen]
    assert texts[0].startswith("[rank0] started"), texts[:3]
    assert any("eval loss" in s for s in texts) and any("%|" in s for s in texts)  # the log lines and the bar
    assert done - seen[0][0] > 3.0, f"the first line came only {done - seen[0][0]:.1f} s before the end"
    assert all(s in run.log for s in texts if s.startswith("[rank0]"))  # still captured, all of it
    assert not any(s.startswith("[rank1]") for s in texts)  # other ranks stay in the log


#: Lines of a real captured run (``configs/runs/smoke.yaml``, 6 steps, a checkpoint at step 3, stop_at_step 3;
#: 2026-12-03, torch 2.13): the checkpoint save's torch warnings come on stderr, the first glued to the bar's last
#: ``\r`` state; ``{root}`` stands for the checkout the run was made in (its absolute path on that machine). The
#: accelerate line is a TRL run's from before quiet.KNOWN filtered it (issue 17), the last line one with a path
#: outside the repository
CAPTURED = r"""[rank0] started: loading torch, the model and the data
[rank0] 13:26:33 smolfsdp.train.native: building model tiny
train:  33%|███▎      | 2/6 [00:01<00:01,  2.07it/s, loss=6.805]
train:  50%|█████     | 3/6 [00:01<00:01,  2.14it/s, loss=6.805]{root}/.venv/lib/python3.11/site-packages/torch/distributed/fsdp/_shard_utils.py:58: UserWarning: `_get_pg_default_device` will be deprecated, it only stays for backward-compatibility reason. If you need to find a device for object collectives, please use `_get_object_coll_device`. If you need to query the device types supported by group, please use `_device_capability(group)`.
  distributed_c10d._get_pg_default_device(pg).type
{root}/.venv/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py:732: FutureWarning: Please use DTensor instead and we are deprecating ShardedTensor.
  local_shape = tensor.shape
[rank0] 09:11:40 accelerate.utils.dataclasses: sharding_strategy is deprecated in favor of reshard_after_forward.
[rank0] 13:26:36 smolfsdp.train.native: checkpoint {root}/runs/book/06_gotchas/drill_native_part/checkpoints/step-000003
train:  50%|█████     | 3/6 [00:02<00:02,  1.31it/s, loss=6.805]
[rank0] 13:26:36 smolfsdp.train.trl_engine: note: transformers deprecates the Trainer's FSDP1 path (FSDP2, fsdp_version 2, is its default); the pinned transformers 5.24.0 still runs it
[rank0] 13:26:36 smolfsdp.train.sft: stopped early at step 3 (stop_at_step): no final evaluation, no final model; it can resume from {root}/runs/book/06_gotchas/drill_native_part/checkpoints/step-000003: the same command without --stop_at_step, plus --resume
[rank0] 13:26:37 smolfsdp.train.sft: data file {elsewhere}/rows.jsonl and run folder {elsewhere}"""


def test_rank0_progress_shows_no_third_party_warning_and_no_absolute_path(tmp_path):
    """What a chapter's page gets from a captured run (issue 33): smolfsdp's own lines, paths under the repository
    relative to it (under another root, relative to that), the bar without the warning glued to it; the warnings
    themselves (each line a ``warnings.warn`` report prints, accelerate's and transformers' logger lines) stay in
    the run's log only."""
    log = CAPTURED.format(root=repo_root(), elsewhere=tmp_path / "data")
    said: list[str] = []
    on_line = runner.rank0_progress(said.append, every_s=0.0, roots=[repo_root(), tmp_path])
    for line in log.splitlines():
        on_line(line)
    assert third_party_warning_lines("\n".join(said)) == []
    assert not machine_paths("\n".join(said)), said
    assert said == [
        "[rank0] started: loading torch, the model and the data",
        "[rank0] 13:26:33 smolfsdp.train.native: building model tiny",
        "train:  33%|███▎      | 2/6 [00:01<00:01,  2.07it/s, loss=6.805]",
        "train:  50%|█████     | 3/6 [00:01<00:01,  2.14it/s, loss=6.805]",  # what was glued to it: dropped
        "[rank0] 13:26:36 smolfsdp.train.native: checkpoint runs/book/06_gotchas/drill_native_part/checkpoints/"
        "step-000003",
        "train:  50%|█████     | 3/6 [00:02<00:02,  1.31it/s, loss=6.805]",
        # smolfsdp's own line saying "deprecates": always shown
        "[rank0] 13:26:36 smolfsdp.train.trl_engine: note: transformers deprecates the Trainer's FSDP1 path "
        "(FSDP2, fsdp_version 2, is its default); the pinned transformers 5.24.0 still runs it",
        "[rank0] 13:26:36 smolfsdp.train.sft: stopped early at step 3 (stop_at_step): no final evaluation, no final "
        "model; it can resume from runs/book/06_gotchas/drill_native_part/checkpoints/step-000003: the same command "
        "without --stop_at_step, plus --resume",
        "[rank0] 13:26:37 smolfsdp.train.sft: data file data/rows.jsonl and run folder data",
    ]


def test_page_line_keeps_other_paths_and_names_that_only_start_like_a_root():
    assert page_line("ckpt /r/repo/runs/a and /r/repo", ["/r/repo"]) == "ckpt runs/a and ."
    assert page_line("/r/repo2/x /r/other/y", ["/r/repo"]) == "/r/repo2/x /r/other/y"


def test_a_run_in_a_notebook_shows_its_progress_by_default(monkeypatch):
    """``runner.run(capture=True)`` in a Jupyter kernel (a chapter's cell) passes a page-safe line filter to the
    launch, so no cell is silent while it trains; outside a kernel, or with ``progress=False``, it stays quiet."""
    seen = []

    def fake_launch(cfg, **kw):
        seen.append(kw.get("on_line"))
        return subprocess.CompletedProcess([], 3, "", None)

    monkeypatch.setattr(runner, "preflight", lambda cfg: {})
    monkeypatch.setattr(runner, "launch", fake_launch)
    cfg = load_config(None)
    for kernel, progress in ((False, None), (True, None), (True, False)):
        if kernel:
            monkeypatch.setitem(sys.modules, "ipykernel", sys)
        else:
            monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
        with pytest.raises(RuntimeError, match="exit code 3"):
            runner.run(cfg, capture=True, progress=progress)
    assert seen[0] is None and callable(seen[1]) and seen[2] is None


def test_a_traceback_through_the_interpreter_shows_its_files_relative_and_a_kill_drill_stops_at_the_kill():
    """Chapter 07's kill drill, as its cell printed it (2026-12-03): rank 0 logs its checkpoints, then, its peer
    SIGKILLed, reports a gloo error through torch's files. A traceback line reads relative to the interpreter's
    prefix; in the drill, the error report after the kill stays in the log (the launcher's verdict says it)."""
    from smolfsdp.probes.drills import _until_killed

    said: list[str] = []
    frame = f'[rank0]:   File "{sys.prefix}/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83'
    runner.rank0_progress(said.append)(frame)
    assert not machine_paths(said[0]), said  # ".venv/lib/..." from the checkout's venv, else "lib/..."
    assert said[0].endswith('lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83'), said

    said.clear()
    killed: dict = {}
    on_line = _until_killed(runner.rank0_progress(said.append, roots=["/r/repo"]), killed)
    on_line(
        "[rank0] 13:45:58 smolfsdp.train.native: checkpoint /r/repo/runs/book/07_scaling/fault_killed/checkpoints/step-000003"
    )
    killed["latest_at_kill"] = "step-000003"  # what kill_after_step sets just before its SIGKILL
    for line in (
        "[rank0]: Traceback (most recent call last):",
        frame,
        "[rank0]: RuntimeError: Connection reset by peer",
    ):
        on_line(line)
    on_line(
        "[rank0] 13:48:03 smolfsdp.train.native: resumed from /r/repo/runs/x/checkpoints/step-000003 at step 3"
    )
    assert said == [
        "[rank0] 13:45:58 smolfsdp.train.native: checkpoint runs/book/07_scaling/fault_killed/checkpoints/step-000003",
        "[rank0] 13:48:03 smolfsdp.train.native: resumed from runs/x/checkpoints/step-000003 at step 3",
    ]
