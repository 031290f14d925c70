"""Fault drills the book runs live: a run stopped and resumed, a rank killed mid-run.

Chapters "Debugging the seams" (``resume_drill``) and "Scaling out" (``kill_rank_drill``) call
these; ``tests/test_checkpoint.py``, ``tests/test_trl_engine.py`` and ``tests/test_faults.py`` hold
the same claims to stricter checks. Each drill compares the final model of the interrupted run with
the final model of the same run left alone.

    python -c "from smolfsdp.probes import drills; from smolfsdp import config; print(drills.kill_rank_drill(config.TrainConfig(max_steps=6)))"

The chapters show the drills' rows with ``tables.show(drills_view.drill_table(rows, root=output_dir))``
(``smolfsdp.book.drills_view``).
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from safetensors.torch import load_file

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.errors import ConfigError
from smolfsdp.launch.progress import HEARTBEAT_S, heartbeat, in_notebook, live_say, rank0_progress
from smolfsdp.launch.runner import preflight, run
from smolfsdp.launch.torchrun import launch
from smolfsdp.measure.results import load_run
from smolfsdp.paths import repo_root


def final_weights(run_dir: str | Path) -> Path:
    """The safetensors file a run trained into: ``final_model/model.safetensors``, or for a LoRA run (whose base
    is frozen) its adapter, ``final_model/adapter/adapter_model.safetensors``.

    Raises ConfigError when ``final_model/`` holds neither, naming what to set."""
    final = Path(run_dir) / "final_model"
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        if (final / name).is_file():
            return final / name
    raise ConfigError(
        f"{final} holds neither model.safetensors nor adapter/adapter_model.safetensors (a LoRA run's); the "
        "drills compare final models: run with save_final_model: true."
    )


def max_abs_diff(run_a: str | Path, run_b: str | Path) -> tuple[int, float]:
    """(tensors compared, largest absolute difference) between two runs' final weights (:func:`final_weights`:
    the model, or a LoRA run's adapter).

    Raises RuntimeError when the two models do not have the same keys; ConfigError when a run has no final weights.
    """
    a, b = (load_file(str(final_weights(run))) for run in (run_a, run_b))
    if a.keys() != b.keys():
        raise RuntimeError(f"the two models' keys differ: {sorted(set(a) ^ set(b))[:4]}")
    return len(a), max(float((a[k] - b[k]).abs().max()) for k in a)


def _check_inside(cfg, step: int) -> None:
    """Before any run: the stop or kill falls inside the run, and the runs write the final models compared."""
    if cfg.max_steps <= 0 or not 1 <= step < cfg.max_steps:
        raise ConfigError(
            f"the drill needs max_steps > {step} >= 1 (got max_steps={cfg.max_steps}); "
            "set max_steps and stop or kill inside the run."
        )
    if not cfg.save_final_model:
        raise ConfigError(
            "the drill compares final models; set save_final_model: true (it is false in this config)."
        )


def resume_drill(cfg, stop_at: int, *, timeout: float | None = 900) -> dict[str, Any]:
    """Run ``cfg`` whole, then again stopped after ``stop_at`` steps and resumed; compare the weights.

    The stopped run saves every step (``save_steps=1``) and ends after step ``stop_at`` as if killed
    (``stop_at_step``; the tests SIGKILL the processes instead). Runs ``<name>_whole`` and
    ``<name>_resumed`` under ``cfg.output_dir``. Returns a label for the table (``run``), engine,
    strategy that ran, steps, the checkpoint resumed from (absolute path), tensors compared and the largest absolute difference (0.0 = bitwise
    equal). Raises ConfigError when ``stop_at`` is not inside the run.
    """
    _check_inside(cfg, stop_at)
    whole = run(cfg.replace(name=f"{cfg.name}_whole"), capture=True, timeout=timeout)
    part = cfg.replace(name=f"{cfg.name}_resumed", save_steps=1, save_total_limit=2)
    run(part.replace(stop_at_step=stop_at), capture=True, timeout=timeout)
    latest = checkpoint.latest_checkpoint(part.run_dir)
    resumed = run(part.replace(resume_from="latest"), capture=True, timeout=timeout)
    tensors, diff = max_abs_diff(whole.path, resumed.path)
    return {
        "run": f"{cfg.engine} engine: stopped, then --resume_from latest",
        "engine": cfg.engine,
        "strategy": resumed.summary["effective"]["strategy"],
        "steps": resumed.summary["metrics"]["steps"],
        "stopped_after": stop_at,
        "resumed_from": str(latest),
        "tensors": tensors,
        "max_abs_diff": diff,
    }


def find_rank_process(rank: int, deadline: float, cmd_hint: str = "smolfsdp.cli"):
    """The ``psutil.Process`` of this process tree's worker with ``RANK=<rank>``, or None at the deadline."""
    while time.time() < deadline:
        for p in psutil.Process().children(recursive=True):
            try:
                if p.environ().get("RANK") == str(rank) and cmd_hint in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.05)
    return None


def kill_after_step(cfg, step: int, result: dict, *, rank: int | None = None, timeout: float = 300.0) -> None:
    """Wait for the run's workers and ``step``'s complete checkpoint, then SIGKILL: rank ``rank``'s process
    alone, or with ``rank=None`` the whole run (every worker, then torchrun).

    The one "kill a run" helper of the drills and the tests. Runs in a thread beside
    :func:`smolfsdp.launch.torchrun.launch` (see :func:`launch_and_kill`) or ``launch.runner.run``; fills ``result``
    with the pids killed (``pids``; ``pid`` for one rank) and the latest complete checkpoint at the
    moment of the kill (``latest_at_kill``), or ``error`` when no worker started before ``timeout``.
    """
    deadline = time.time() + timeout
    marker = cfg.run_dir / "checkpoints" / f"step-{step:06d}" / checkpoint.MARKER
    victim = find_rank_process(0 if rank is None else rank, deadline)
    if victim is None:
        result["error"] = f"rank {0 if rank is None else rank} never started"
        return
    while not marker.exists() and time.time() < deadline and victim.is_running():
        time.sleep(0.005)
    result["latest_at_kill"] = checkpoint.latest_checkpoint(cfg.run_dir)
    if rank is not None:
        result["pid"] = victim.pid
        victim.send_signal(signal.SIGKILL)
        return
    run = [p for p in psutil.Process().children(recursive=True) if _runs(p, "smolfsdp.cli")]
    workers = [p for p in run if _environ(p).get("RANK") is not None]
    for p in workers + [p for p in run if p not in workers]:  # workers first: torchrun would restart them
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    # wait for the workers only: waiting on torchrun (this process's child) here would reap it, and the
    # launcher's own Popen.wait would then read exit code 0 instead of -9
    psutil.wait_procs(workers, timeout=30)
    result["pids"] = [p.pid for p in run]


def _runs(p: psutil.Process, cmd_hint: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return cmd_hint in " ".join(p.cmdline())
    return False


def _environ(p: psutil.Process) -> dict[str, str]:
    with contextlib.suppress(psutil.Error):
        return p.environ()
    return {}


def launch_and_kill(cfg, step: int, *, rank: int | None = None, timeout: float | None = 300.0):
    """:func:`smolfsdp.launch.torchrun.launch` ``cfg`` (output captured) while :func:`kill_after_step` kills
    rank ``rank`` (None: the whole run) once ``step``'s checkpoint is complete.

    Inside a Jupyter kernel rank 0's lines stream as the run goes on (as ``runner.run`` streams them:
    ``launch.progress.rank0_progress``), so the cell is not silent until the kill; once the kill is sent, rank
    0's own error report (``[rank0]: Traceback ...``: it loses its peer, as the drill means it to) stays in the
    captured output only: the launcher's verdict says what happened (:func:`kill_rank_drill` shows it).

    Returns ``(the launch's CompletedProcess, the kill's result dict)``. Raises RuntimeError when no
    worker started.
    """
    killed: dict[str, Any] = {}
    killer = threading.Thread(target=kill_after_step, args=(cfg, step, killed), kwargs={"rank": rank})
    killer.start()
    # as runner.run streams: a "still running" line wherever rank 0 says nothing for HEARTBEAT_S (its start-up)
    beat = heartbeat(f"run {cfg.name!r}", HEARTBEAT_S if in_notebook() else None, live_say())
    on_line = (
        _until_killed(rank0_progress(beat.relay, roots=[repo_root(), cfg.output_dir]), killed)
        if in_notebook()
        else None
    )
    try:
        with beat:
            proc = launch(cfg, capture=True, timeout=timeout, on_line=on_line)
    finally:
        killer.join()
    if "error" in killed:
        raise RuntimeError(killed["error"])
    return proc, killed


def _until_killed(on_line: Callable[[str], None], killed: dict[str, Any]) -> Callable[[str], None]:
    """``on_line``, except for the ``[rank0]:`` lines (a rank's error report) that come once :func:`kill_after_step`
    has killed (``latest_at_kill`` is set just before its SIGKILL); rank 0's log lines and bar still pass, so an
    elastic restart shows its progress too."""

    def passed(line: str) -> None:
        if "latest_at_kill" in killed and line.lstrip().startswith("[rank0]:"):
            return
        on_line(line)

    return passed


def page_text(text: str, output_dir) -> str:
    """``text`` as a page may print it, without the paths of the machine that ran it: run folders relative to
    ``output_dir``, the interpreter by its name (torchrun's "of binary: /…/bin/python")."""
    for folder in {str(Path(output_dir)), str(Path(output_dir).resolve())}:
        text = text.replace(folder.rstrip("/") + "/", "")
    return re.sub(r"(of binary: )\S+", lambda m: m[1] + Path(sys.executable).name, text)


def kill_rank_drill(
    cfg,
    *,
    rank: int = 1,
    after_step: int = 3,
    timeout: float | None = 900,
    reference: str | Path | None = None,
) -> dict[str, Any]:
    """SIGKILL one rank after ``after_step``'s checkpoint, read the launcher's verdict, resume, compare.

    With ``cfg.max_restarts > 0`` torchrun restarts the workers itself and they resume from the
    latest checkpoint (elastic); otherwise the run fails, and a second launch with
    ``resume_from="latest"`` (``smolfsdp train --resume``) finishes it. Runs ``<name>_whole`` (unless
    ``reference``, the folder of a finished run of the same settings, is given: e.g. an earlier drill's)
    and ``<name>_killed`` under ``cfg.output_dir``. Returns the launcher's last line, the checkpoint the
    run resumed from, the optimizer steps done, the largest weight difference from the run left alone,
    that run's folder (``reference``) and a label for the table (``run``). Raises ConfigError when ``after_step`` is not inside the run, RuntimeError when the
    kill came too late (the run finished first).
    """
    _check_inside(cfg, after_step)
    if reference is None:
        reference = run(cfg.replace(name=f"{cfg.name}_whole"), capture=True, timeout=timeout).path
    victim = cfg.replace(name=f"{cfg.name}_killed", save_steps=1, save_total_limit=cfg.max_steps)
    preflight(victim)
    said = io.StringIO()  # the launcher's verdict on stderr, re-emitted without this machine's paths
    with contextlib.redirect_stderr(said):
        first, killed = launch_and_kill(victim, after_step, rank=rank, timeout=timeout)
    sys.stderr.write(page_text(said.getvalue(), cfg.output_dir))
    lines = page_text(first.stdout or "", cfg.output_dir).strip().splitlines()
    if first.returncode != 0:  # the launcher's own verdict is its last line
        verdict = lines[-1] if lines else ""
    else:  # elastic: torchrun's report of the failure it restarted from
        verdict = next((ln for ln in lines if "exitcode: -9" in ln or "Restarting" in ln), "")
    if first.returncode != 0:
        resumed = run(victim.replace(resume_from="latest"), capture=True, timeout=timeout)
    else:
        resumed = load_run(victim.run_dir)
    m = resumed.summary["metrics"]
    if not m.get("resumed_from"):
        raise RuntimeError("the run finished before the kill; raise max_steps or kill earlier")
    tensors, diff = max_abs_diff(reference, resumed.path)
    how = f"torchrun restarts (max_restarts={cfg.max_restarts})" if cfg.max_restarts else "then --resume"
    return {
        "run": f"rank {rank} killed, {how}",
        "killed": f"rank {rank} (pid {killed['pid']}) after step {after_step}",
        "max_restarts": cfg.max_restarts,
        "first_launch_exit_code": first.returncode,
        "launcher_said": verdict,
        "resumed_from": m["resumed_from"],
        "optimizer_steps": m.get("optimizer_step", m.get("steps")),
        "tensors": tensors,
        "max_abs_diff": diff,
        "reference": str(reference),
    }
