"""Gotchas where one rank is not in a collective the others wait in: a full state dict gathered by rank 0
alone (a save that hangs), and rank 0 tokenising alone while the others wait at a barrier (a timeout).

Chapter "Debugging the seams" (``notebooks/06_gotchas.ipynb``), in the one 2-rank launch of
``smolfsdp.gotchas.run_all``. A real hang lasts the process group's timeout (torch's default: 10 minutes for
NCCL, 30 for gloo; the Trainer's ``ddp_timeout``: 30 minutes), so each failing form runs in a gloo group of
its own with a timeout of :data:`SHORT_TIMEOUT_S`, destroyed afterwards: the launch's default group stays
usable for the gotchas after it. Each fixed form runs first.

    smolfsdp gotchas --run state_dict_one_rank,rank0_works_alone
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.constants import default_pg_timeout
from torch.distributed.device_mesh import DeviceMesh
from transformers import TrainingArguments

from smolfsdp.gotchas.builders import decoder_layer_cls, shard_fsdp2, tiny_model
from smolfsdp.gotchas.registry import gotcha
from smolfsdp.installed_source import installed_line
from smolfsdp.sharding.distributed import CollectiveError, name_collective_errors
from smolfsdp.sharding.fsdp2 import apply_fsdp2

SHORT_TIMEOUT_S = 1.5  # the failing forms' group timeout: the hang made short enough to watch
RANK0_WORK_S = 3.0  # how long rank 0 works alone (a sleep standing in for tokenising a large data set)


@contextmanager
def gloo_group(timeout_s: float) -> Iterator[dist.ProcessGroup]:
    """A gloo group of every rank whose collectives time out after ``timeout_s``; every rank waits for the others
    on the default group before it is destroyed (a group left after a timeout is not reused)."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    try:
        yield group
    finally:
        dist.barrier()
        dist.destroy_process_group(group)


#: gloo's errors start with its source file (``[/__w/pytorch/.../gloo/transport/tcp/pair.cc:553] ``) and may end
#: in advice and a peer's address and port (a new one each run): the page keeps the first sentence
_GLOO_PREFIX = re.compile(r"^\[[^\]]*/gloo/[^\]]*\] ")
_PEER = re.compile(r" \[[0-9.]+\]:\d+")


def _error(err: BaseException) -> dict[str, Any]:
    """The exception's type and its first line (gloo's: its first sentence, without file or peer address)."""
    message = (str(err).strip().splitlines() or [""])[0]
    if _GLOO_PREFIX.match(message):
        message = _PEER.sub("", _GLOO_PREFIX.sub("", message)).split(". ")[0]
    return {"outcome": "error", "error": type(err).__name__, "message": message}


def _timed(fn: Callable[[], Any]) -> tuple[dict[str, Any], float]:
    """``fn()``'s outcome (``ok`` or its error, first line) and the seconds it took."""
    t0 = time.perf_counter()
    try:
        fn()
        said = {"outcome": "ok"}
    except Exception as err:  # recorded: the failing form is expected to time out
        said = _error(err)
    return said, round(time.perf_counter() - t0, 1)


@gotcha("state_dict_one_rank")
def state_dict_one_rank(rank: int, world: int) -> dict[str, Any]:
    options = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(shard_fsdp2(tiny_model()[0], world), options=options)  # every rank calls it
    fixed = {"outcome": "ok", "called_on": "every rank", "keys_on_rank0": len(state)}
    failing: dict[str, Any] = {"called_on": "rank 0 only", "group_timeout_s": SHORT_TIMEOUT_S}
    with gloo_group(SHORT_TIMEOUT_S) as group:
        model = apply_fsdp2(tiny_model()[0], DeviceMesh.from_group(group, "cpu"), decoder_layer_cls())
        if rank == 0:  # `if rank == 0: sd = get_model_state_dict(...)`: rank 1 skips the gather
            t0 = time.perf_counter()
            try:
                with name_collective_errors():
                    get_model_state_dict(model, options=options)
                failing["outcome"] = "ok"
            except CollectiveError as err:  # the raw gloo error, then what the package's guard makes of it
                failing.update(_error(err.__cause__ or err), package_guard=_error(err))
            except Exception as err:  # recorded: any other failure is shown as it is
                failing.update(_error(err))
            failing["waited_s"] = round(time.perf_counter() - t0, 1)
    failing["where"] = installed_line("torch/distributed/_state_dict_utils.py", "value = value.redistribute(")
    failing["default_timeouts_s"] = default_timeouts_s()
    return {"failing": failing, "fixed": fixed}


def default_timeouts_s() -> dict[str, int]:
    """What a real hang lasts with the installed libraries' defaults: torch's process-group timeout
    (``torch.distributed.constants.default_pg_timeout``; NCCL's own, shorter, exists only on CUDA builds) and the
    Trainer's ``ddp_timeout`` (seconds)."""
    trainer = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "ddp_timeout")
    return {
        "torch default_pg_timeout": int(default_pg_timeout.total_seconds()),
        "Trainer ddp_timeout": int(trainer),
    }


def main_process_first(group: dist.ProcessGroup, rank: int, work: Callable[[], None]) -> None:
    """transformers' ``TrainingArguments.main_process_first`` (TRL's ``global_then_local_main_first``): the other
    ranks wait at a barrier while rank 0 works, then rank 0 joins it."""
    if rank != 0:
        dist.barrier(group=group)
    else:
        work()
        dist.barrier(group=group)


@gotcha("rank0_works_alone")
def rank0_works_alone(rank: int, world: int) -> dict[str, Any]:

    def form(timeout_s: float) -> dict[str, Any]:
        with gloo_group(timeout_s) as group:
            said, waited = _timed(lambda: main_process_first(group, rank, lambda: time.sleep(RANK0_WORK_S)))
        everyone = _by_rank(said, world)
        errors = [r for r in everyone.values() if r["outcome"] == "error"]
        head = errors[-1] if errors else {"outcome": "ok"}  # the waiting rank's error names the timeout
        seconds = _by_rank(waited, world)
        by_rank = {r: f"{_said(everyone[r])} after {seconds[r]:.1f} s" for r in everyone}
        return {**head, "rank0_works_s": RANK0_WORK_S, "group_timeout_s": timeout_s, "by_rank": by_rank}

    fixed = form(RANK0_WORK_S + 60)  # the wait sized to the work (ddp_timeout, InitProcessGroupKwargs)
    failing = form(SHORT_TIMEOUT_S)
    failing["where"] = [
        installed_line("trl/trainer/sft_trainer.py", "with global_then_local_main_first():"),
        installed_line("accelerate/state.py", "def _goes_first(self, is_main: bool):"),
        installed_line("transformers/training_args.py", 'accelerator_state_kwargs["timeout"] = timedelta('),
    ]
    return {"failing": failing, "fixed": fixed}


def _said(form: dict[str, Any]) -> str:
    return f"{form['error']} ({form['message']})" if form["outcome"] == "error" else form["outcome"]


def _by_rank(value: Any, world: int) -> dict[str, Any]:
    got: list[Any] = [None] * world
    dist.all_gather_object(got, value)
    return {f"rank{r}": v for r, v in enumerate(got)}
