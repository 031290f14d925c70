"""One evaluation schedule for both engines (issue 27): step 0 when ``eval_on_start``, every ``eval_steps``,
and after the last step; the headline names the steps it compares.

The native loop calls ``steps.is_eval_step``; the TRL engine's Trainer gets ``trl_args`` and
``build_callbacks``. Here the Trainer's own flow callback (transformers 5.24 ``DefaultFlowCallback``) and
smolfsdp's callbacks are stepped by hand through a run, without training, and must evaluate at exactly the
native engine's steps.
"""

import pytest
import torch
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import DefaultFlowCallback

from smolfsdp.config import TrainConfig
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.train.sft import eval_headline
from smolfsdp.train.steps import eval_metrics, is_eval_step
from smolfsdp.train.trl_engine import build_callbacks, trl_args

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


def native_schedule(cfg: TrainConfig, total: int, has_eval: bool = True) -> list[int]:
    """The steps the native engine evaluates at (``NativeTrainer.train``): 0, the schedule, the last."""
    if not has_eval or cfg.benchmark_steps:
        return []
    start = [0] if cfg.eval_on_start else []
    return start + [s for s in range(1, total + 1) if is_eval_step(s, total, cfg.eval_steps)]


def trainer_schedule(cfg: TrainConfig, total: int, tmp_path, has_eval: bool = True) -> list[int]:
    """The steps the TRL engine's Trainer evaluates at, from its arguments and callbacks as built."""
    args = trl_args(cfg, CPU, str(tmp_path / "t"), "SmolLM3DecoderLayer", has_eval=has_eval)
    _, _, ours = build_callbacks(cfg, CPU, writer=None, model=None, n_params=1, prof=None, has_eval=has_eval)
    callbacks = [DefaultFlowCallback(), *ours[1:]]  # ours[0] writes metrics.jsonl: not part of the flow
    state = TrainerState(max_steps=total)
    state.compute_steps(args, total)
    seen = [0] if args.eval_on_start else []  # Trainer._inner_training_loop, before the first step
    for step in range(1, total + 1):
        state.global_step = step
        control = TrainerControl()
        for cb in callbacks:
            control = cb.on_step_end(args, state, control) or control
        if control.should_evaluate:
            seen.append(step)
        if control.should_training_stop:
            break
    return seen


@pytest.mark.parametrize(
    ("eval_steps", "eval_on_start", "total", "expected"),
    [
        (3, True, 7, [0, 3, 6, 7]),
        (3, True, 6, [0, 3, 6]),  # the last step is a multiple: evaluated once
        (3, False, 7, [3, 6, 7]),
        (0, True, 5, [0, 5]),  # --eval_steps 0: step 0 and after the last step, as its help says
        (0, False, 5, [5]),
    ],
)
def test_both_engines_evaluate_at_the_same_steps(tmp_path, eval_steps, eval_on_start, total, expected):
    cfg = TrainConfig(engine="trl", eval_steps=eval_steps, eval_on_start=eval_on_start, max_steps=total)
    assert native_schedule(cfg, total) == expected
    assert trainer_schedule(cfg, total, tmp_path) == expected


def test_no_evaluation_without_eval_rows_or_in_benchmark_mode(tmp_path):
    cfg = TrainConfig(engine="trl", eval_steps=2, max_steps=4)
    assert trainer_schedule(cfg, 4, tmp_path, has_eval=False) == native_schedule(cfg, 4, False) == []
    bench = cfg.replace(benchmark_steps=3)  # benchmark mode times training steps only
    args = trl_args(bench, CPU, str(tmp_path / "t"), "SmolLM3DecoderLayer")
    assert (args.eval_strategy, args.eval_on_start, native_schedule(bench, 4)) == ("no", False, [])


def test_stop_at_step_ends_without_the_last_evaluation(tmp_path):
    """A run ended early by ``stop_at_step`` has no evaluation after its last step (both engines)."""
    cfg = TrainConfig(engine="trl", eval_steps=0, max_steps=6, stop_at_step=4)
    assert trainer_schedule(cfg, 6, tmp_path) == [0]


def test_headline_names_the_steps_it_compares():
    m = eval_metrics([(0, 6.94612), (50, 5.9), (108, 5.37049)])
    assert m == {
        "eval_loss_first": 6.94612,
        "eval_loss_last": 5.37049,
        "eval_step_first": 0,
        "eval_step_last": 108,
    }
    assert eval_headline(m) == "eval loss 6.946 (step 0) -> 5.370 (step 108)"
    assert eval_headline(eval_metrics([(5, 6.5)])) == "eval loss 6.500 (step 5)"
    assert eval_metrics([]) == dict.fromkeys(m)
