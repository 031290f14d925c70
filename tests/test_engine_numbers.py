"""Both engines log the numbers a step really had (issue 34): the learning rate the optimizer applied in
that step, and an eval loss equal to one process evaluating every eval row once (token-weighted).

The two engines run the same 3 steps on 2 gloo ranks (FSDP1) with 7 eval rows (odd: one rank holds 4,
the other 3) in eval batches of 2 (the last batch of one rank is a padding batch). The native engine used
to log the lr after ``scheduler.step()`` (the next step's: 0.003, 0.0015, 0.0); the TRL engine's Trainer
loop counted one row twice and averaged batch means (6.950521 for 6.951163).
"""

import math

import pytest
import torch
from _dist import run_distributed

from smolfsdp.config import load_config
from smolfsdp.launch import runner
from smolfsdp.paths import recipe
from smolfsdp.sharding.distributed import DistInfo
from smolfsdp.train import native, steps

KW = dict(
    max_steps=3,
    eval_steps=0,
    eval_on_start=True,
    eval_size=7,
    per_device_eval_batch_size=2,
    per_device_train_batch_size=2,
    max_length=128,
    too_long="truncate",
    learning_rate=0.003,
    lr_scheduler_type="linear",
    warmup_ratio=0.34,
)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {
        engine: runner.run(
            load_config(recipe(name), **KW).replace(name=engine, output_dir=str(out)),
            capture=True,
            timeout=600,
        )
        for engine, name in (("native", "smoke"), ("trl", "smoke_trl"))
    }


def applied_lrs(cfg, total: int) -> list[float]:
    """The lr in the optimizer's param group when each of ``total`` steps runs (the scheduler's value)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.learning_rate)
    sched = native.make_scheduler(opt, cfg, total)
    lrs = []
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_both_engines_log_the_lr_each_step_applied(both):
    cfg = load_config(recipe("smoke"), **KW)
    expected = applied_lrs(cfg, 3)
    assert expected[:2] == [0.0, pytest.approx(0.0015)]  # warm-up from 0 over 2 steps (0.34 x 3, rounded up)
    for engine, run in both.items():
        assert list(run.train["step"]) == [1, 2, 3], engine
        assert list(run.train["learning_rate"]) == pytest.approx(expected, abs=1e-12), engine
    # same steps, same data, same lr: the same losses
    assert list(both["trl"].train["loss"]) == pytest.approx(list(both["native"].train["loss"]), rel=1e-5)


def test_both_engines_eval_loss_is_every_row_once(both):
    native_ev = both["native"].eval.set_index("step")["eval_loss"]
    trl_ev = both["trl"].eval.set_index("step")["eval_loss"]
    assert list(native_ev.index) == list(trl_ev.index) == [0, 3]
    for step in (0, 3):
        assert abs(trl_ev[step] - native_ev[step]) < 1e-6, (step, trl_ev[step], native_ev[step])


ROWS = [  # 7 rows of unequal length: padded batches; labels mask the prompt part
    {"input_ids": list(range(5, 5 + n)), "labels": [-100] * (n // 3) + list(range(5 + n // 3, 5 + n))}
    for n in (9, 17, 4, 12, 23, 6, 15)
]


def _collate(rows):
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([r["input_ids"] + [0] * (n - len(r["input_ids"])) for r in rows])
    labels = torch.tensor([r["labels"] + [-100] * (n - len(r["labels"])) for r in rows])
    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (n - len(r["input_ids"])) for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "completion_mask": mask}


def _model():
    from smolfsdp.models.modeling import build_model, load_tokenizer

    return build_model("tiny", load_tokenizer("tiny"), seed=0).eval()


def _evaluate_on_ranks(rank, world_size):
    info = DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
    )
    return steps.evaluate(_model(), ROWS, _collate, 2, info)


def _reference() -> float:
    """One process, one row at a time: summed token loss over all label tokens / their number."""
    model, total, count = _model(), 0.0, 0
    with torch.no_grad():
        for row in ROWS:
            b = _collate([row])
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[0, :-1]
            target = b["labels"][0, 1:]
            keep = target != -100
            total += float(
                torch.nn.functional.cross_entropy(logits[keep].double(), target[keep], reduction="sum")
            )
            count += int(keep.sum())
    return total / count


def test_evaluate_on_two_ranks_equals_one_process():
    ref = _reference()
    got = run_distributed(_evaluate_on_ranks, 2)
    assert got[0] == got[1]
    assert math.isclose(got[0], ref, rel_tol=0, abs_tol=1e-6), (got[0], ref)
