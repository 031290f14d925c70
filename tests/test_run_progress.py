"""A captured run still shows its progress while it goes on (issue 33: chapter 04's training cells were
silent for minutes in Jupyter): ``runner.run(cfg, capture=True, progress=...)``."""

import time

from smolfsdp.config import load_config
from smolfsdp.launch import runner
from smolfsdp.paths import recipe


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
