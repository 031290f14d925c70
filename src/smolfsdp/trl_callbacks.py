"""A ``TrainerCallback`` that writes the Trainer's logs into the smolfsdp run format.

The TRL engine and the native engine then produce the same ``metrics.jsonl`` (see ``results``).
"""

from __future__ import annotations

import time
from typing import Any

from transformers import TrainerCallback


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
