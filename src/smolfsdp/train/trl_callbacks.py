"""``TrainerCallback``s of the TRL engine: the Trainer's logs in the smolfsdp run format, and on screen.

``RunWriterCallback``: the TRL engine and the native engine then produce the same ``metrics.jsonl``
(see ``results``). ``OneLineProgressCallback``: one readable line per logging step on rank 0 instead
of the Trainer's raw log dict. ``EvalAtEndCallback``: the evaluation after the last step with ``eval_steps`` 0.
"""

from __future__ import annotations

import time
from typing import Any

from transformers import PrinterCallback, ProgressCallback, TrainerCallback


class RunWriterCallback(TrainerCallback):
    """Turns ``on_log`` events into ``{"split": "train"|"eval", "step": ..., ...}`` records."""

    def __init__(self, writer, samples_per_step: int):
        self.writer = writer
        self.samples_per_step = samples_per_step
        self.records: list[dict[str, Any]] = []
        self._t0: float | None = None
        self._step_ms: float | None = None
        self._tokens_seen = 0
        self.tokens_at_start = 0  # tokens seen before this launch (a resumed run's earlier part)
        self.bench = None  # a trl_trainer.BenchmarkCallback in benchmark mode: its step rows join the log

    def on_train_begin(self, args, state, control, **kwargs):
        self._tokens_seen = int(state.num_input_tokens_seen or 0)  # a resumed run starts where it stopped
        self.tokens_at_start = self._tokens_seen

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._t0 is not None:
            self._step_ms = (time.perf_counter() - self._t0) * 1e3

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "eval_loss" in logs:
            rec = {"split": "eval", "step": state.global_step, "eval_loss": logs["eval_loss"]}
        elif "loss" in logs:
            seen = int(state.num_input_tokens_seen or 0)
            rec = {
                "split": "train",
                "step": state.global_step,
                "epoch": logs.get("epoch"),
                "loss": logs["loss"],
                "learning_rate": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "step_time_ms": self._step_ms,
                "tokens": seen - self._tokens_seen,
                "samples": self.samples_per_step,
            }
            self._tokens_seen = seen
            if (
                self.bench is not None
                and self.bench.records
                and self.bench.records[-1]["step"] == state.global_step
            ):
                rec.update(self.bench.records[-1])
        else:
            return
        self.records.append(rec)
        if state.is_world_process_zero:
            self.writer.log(rec)


class EvalAtEndCallback(TrainerCallback):
    """Evaluate after the last step when ``eval_steps`` is 0 (``eval_strategy="no"``): the Trainer's own
    end-of-training evaluation needs ``eval_strategy="steps"``, which would also evaluate in between.
    A run ended early (``stop_at_step``) is not evaluated, as in the native engine."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_evaluate = True
        return control


def log_line(step: int, max_steps: int, logs: dict[str, Any]) -> str | None:
    """One line for a Trainer log event: a training step or an evaluation; None for other events
    (the end-of-training summary, which ``smolfsdp.train.sft`` reports itself).

    ``step 2/4  loss 6.934  grad_norm 2.354  lr 3.00e-03  tokens seen 3,494  epoch 0.10``
    """
    head = f"step {step}/{max_steps}"
    if "eval_loss" in logs:
        return f"{head}  eval_loss {logs['eval_loss']:.4f}"
    if "loss" not in logs:
        return None
    parts = [head, f"loss {float(logs['loss']):.4f}"]
    if logs.get("grad_norm") is not None:
        parts.append(f"grad_norm {float(logs['grad_norm']):.3f}")
    if logs.get("learning_rate") is not None:
        parts.append(f"lr {float(logs['learning_rate']):.2e}")
    if logs.get("num_input_tokens_seen") is not None:
        parts.append(f"tokens seen {int(logs['num_input_tokens_seen']):,}")
    if logs.get("epoch") is not None:
        parts.append(f"epoch {float(logs['epoch']):.2f}")
    return "  ".join(parts)


class OneLineProgressCallback(ProgressCallback):
    """The Trainer's progress bar, with one :func:`log_line` per log event on rank 0 instead of the
    raw dict ``ProgressCallback.on_log`` (or ``PrinterCallback``) writes."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        line = log_line(state.global_step, state.max_steps, logs)
        if line is not None:
            (self.training_bar.write if self.training_bar is not None else print)(line)


def use_one_line_progress(trainer) -> None:
    """Replace the Trainer's default progress/printer callback with :class:`OneLineProgressCallback`."""
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(OneLineProgressCallback())
