"""Launched processes that never outlive their launcher: a process group of their own, stopped as a group.

:func:`spawn` starts a child (torchrun, a probe, the gotchas) in a new session, so one ``os.killpg`` reaches
it and every rank it started, and a terminal's Ctrl-C reaches only the launcher, which then stops the group
in order (``smolfsdp.launch.torchrun.stop``). On Linux the child is also asked (``PR_SET_PDEATHSIG``) for a
SIGTERM when its launcher dies without cleaning up (SIGKILL, a crash): torchrun answers it by stopping its
ranks. :func:`run_group` is ``subprocess.run`` on top of that, and :func:`stop_on_signals` is the handler a
process that must end everything it started installs (the test suite's ``tests/conftest.py``).

    python -c "from smolfsdp.launch.processes import run_group; print(run_group(['sleep', '1']).returncode)"
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading

import psutil

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_launcher(launcher_pid: int):
    """The ``preexec_fn`` of :func:`spawn` (runs in the child between fork and exec): SIGTERM this child
    when the launcher's thread dies; exit at once if the launcher is already gone."""

    def set_death_signal() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != launcher_pid:  # it died before prctl took effect
            os._exit(1)

    return set_death_signal


def spawn(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kwargs)`` in a new session (its own process group, whose id is the
    child's pid) that receives SIGTERM when this process dies (Linux)."""
    preexec = _die_with_launcher(os.getpid()) if _LIBC is not None else None
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=preexec, **popen_kwargs)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to ``proc``'s process group: ``proc`` and whatever it started that stayed in the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM ``proc``'s group, then SIGKILL it when ``proc`` has not ended within ``grace_s`` seconds;
    always a last SIGKILL to the group, so a rank that outlived its torchrun goes too."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)


def run_group(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)``, the child started by
    :func:`spawn`: on a timeout, Ctrl-C or any error its whole group is stopped (:func:`stop_group`), where
    ``subprocess.run`` would kill the child alone and leave its ranks running. Raises what ``run`` raises."""
    proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop_descendants(grace_s: float = 5.0) -> list[int]:
    """SIGTERM every live descendant of this process (children, their children, other sessions included),
    then SIGKILL those still running after ``grace_s`` seconds. Returns their pids."""
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def stop_on_signals(hard_exit_after_s: float = 60.0) -> None:
    """From now on SIGTERM and SIGINT stop every descendant (:func:`stop_descendants`), say so on stderr,
    and raise KeyboardInterrupt, so the caller (pytest) ends its session as after Ctrl-C. Should anything
    swallow that exception, the process exits anyway after ``hard_exit_after_s`` seconds (128 + signal)."""

    def handler(signum, frame):
        name = signal.Signals(signum).name
        stopped = stop_descendants()
        print(f"[smolfsdp] {name}: stopped {len(stopped)} launched process(es)", file=sys.stderr, flush=True)
        timer = threading.Timer(hard_exit_after_s, os._exit, args=(128 + signum,))
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt(f"{name} received")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
