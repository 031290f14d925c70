"""The environment every run's ranks start with (:func:`launch_env`), and how many OpenMP threads each gets: what
the machine has free, divided among this node's processes (:func:`omp_threads`).

torch's intra-op pool is OpenMP. A rank with more threads than free cores waits at every parallel region for the
thread the scheduler has put aside: measured here, ``--nproc 1`` on 2 cores got 2 threads (``cpu_count // nproc``)
and ran 8-17x slower as soon as another process ran. So the launcher counts the cores this process may run on
(``os.sched_getaffinity``: a container or ``taskset`` limit, not the machine's total), takes off the cores the
1-minute load average says are busy, and gives each process its share, at least one thread. An
``OMP_NUM_THREADS`` the user set is kept. The launcher (``smolfsdp.launch.torchrun.launch``) says which value it
set and why once per node before the ranks start (:data:`THREADS_NOTE`).

    python -c "from smolfsdp.launch.threads import omp_threads; print(omp_threads(2))"
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

#: Flight-recorder entries kept per process group (torch's ring buffer of recent collectives):
#: names the collective in a timeout error (smolfsdp.sharding.distributed.name_collective_errors).
FLIGHT_RECORDER_ENTRIES = 2000
#: The variable :func:`launch_env` leaves :func:`omp_threads`' reason in, for the launcher to print
THREADS_NOTE = "SMOLFSDP_THREADS_NOTE"


def launch_env(nproc: int, max_restarts: int = 0) -> dict[str, str]:
    """This process's environment plus the settings every run's ranks need: ``OMP_NUM_THREADS`` for ``nproc``
    processes on this node (:func:`omp_threads`; its reason in :data:`THREADS_NOTE`), the flight recorder."""
    env = dict(os.environ)
    if max_restarts:
        # torchrun 2.13 lets the workers share its rendezvous TCPStore; a restarted group then reads the
        # dead group's gloo addresses from it ("connectFullMesh failed ... Connection refused", 4 of 6
        # restarts here). A fresh store per restart (rank 0 hosts it on a new port) avoids the race.
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # processes on a busy or small box: the free cores shared out, or ranks fight over the cores
    threads, env[THREADS_NOTE] = omp_threads(nproc, env)
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torch's flight recorder: the last collectives of each rank, so a timeout can name its collective
    env.setdefault("TORCH_FR_BUFFER_SIZE", str(FLIGHT_RECORDER_ENTRIES))
    return env


def usable_cores() -> tuple[int, str]:
    """(cores this process may run on, how that was read): ``os.sched_getaffinity(0)`` where the platform has it
    (Linux), else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)), "sched_getaffinity"
    return os.cpu_count() or 1, "cpu_count"


def busy_cores() -> float:
    """The 1-minute load average (runnable processes, a number of busy cores); 0.0 where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def omp_threads(
    nproc: int,
    environ: Mapping[str, str] | None = None,
    *,
    cores: tuple[int, str] | None = None,
    load: float | None = None,
) -> tuple[int | str, str]:
    """(``OMP_NUM_THREADS`` for each of ``nproc`` processes on this node, one line saying why).

    ``environ`` (default ``os.environ``) with ``OMP_NUM_THREADS`` set: that value, kept as given. Else
    ``max(1, free // nproc)`` with ``free = max(1, usable - ceil(min(load, usable) - 0.5))``: the usable cores
    (:func:`usable_cores`) less the busy ones (:func:`busy_cores`, rounded half down). ``cores`` and ``load``
    replace what the machine reports (tests)."""
    env = os.environ if environ is None else environ
    if env.get("OMP_NUM_THREADS"):
        given = env["OMP_NUM_THREADS"]
        return given, f"OMP_NUM_THREADS={given} per process, kept as set in the environment"
    usable, how = cores or usable_cores()
    busy = busy_cores() if load is None else load
    free = max(1, usable - max(0, math.ceil(min(busy, usable) - 0.5)))
    threads = max(1, free // max(1, nproc))
    return threads, (
        f"OMP_NUM_THREADS={threads} per process for {nproc} process(es): {usable} usable core(s) ({how}), "
        f"load average {busy:.2f} leaves {free} free; set OMP_NUM_THREADS to choose"
    )
