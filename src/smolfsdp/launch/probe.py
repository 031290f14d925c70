"""The one way to launch a probe: code the book runs on N CPU ranks that writes JSON into ``--out``,
started through torchrun with the GPUs hidden, checked, and read back.

Every launch of ranks that shard on CPU on purpose goes through here: the chapters' probes
(``smolfsdp.probes.mechanics``, ``step``, ``dtype_rule``, ``measured``), the seeds' code
(``smolfsdp.audit.seeds.seed_code``) and the gotchas (``smolfsdp.gotchas.run_all``). Three parts:

* :func:`run_probe`, the launch: ``torchrun`` in a process group of its own (a timeout or Ctrl-C stops
  every rank), GPUs hidden (:func:`cpu_probe_env`), output captured; a failure raises with the ranks'
  output, or with ``check=False`` is returned for the caller to read (the gotchas' crash form);
* :func:`probe_main`, the ``--out DIR`` entry point a probe module runs on each rank;
* :func:`read_results`, the JSON the ranks wrote: rank 0's one file, or every rank's, by rank.

A probe module, whole (``smolfsdp.probes.step`` is one):

    def record(out: Path) -> None: ...             # each rank: measure, write out / f"x_rank{rank}.json"
    def measure_x(out_dir, nproc=2, timeout=600):  # the chapter calls this
        run_probe("x probe", "smolfsdp.probes.x", ["--out", str(out_dir)], nproc, timeout)
        return read_results(out_dir, "x_rank{rank}.json", nproc)
    def main() -> None:
        probe_main(record, __doc__)

    python -c "from smolfsdp.launch.probe import run_probe; print(run_probe('x', 'smolfsdp.errors', [], 1, 120))"
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smolfsdp.launch.processes import run_group
from smolfsdp.launch.progress import HEARTBEAT_S, heartbeat, in_notebook, live_say
from smolfsdp.launch.rank_env import launch_env
from smolfsdp.launch.torchrun import torchrun_command


def cpu_probe_env(nproc: int) -> dict[str, str]:
    """:func:`smolfsdp.launch.rank_env.launch_env` with every GPU hidden (``CUDA_VISIBLE_DEVICES=""``), for
    ranks that shard on CPU on purpose: the book's probes and gotchas.

    Why: on a machine with GPUs, ``init_distributed()`` picks NCCL, while these probes build a CPU
    mesh, FSDP1 with ``device_id=cpu`` or a CPU DDP: torch then stops with "No backend type associated
    with device type cpu". Hidden GPUs give gloo, the backend those probes are written for, so a
    chapter measures on a GPU box what it measures on CPU (tests/test_probe_launchers.py).
    """
    return {**launch_env(nproc), "CUDA_VISIBLE_DEVICES": ""}


def run_probe(
    what: str,
    target: str | Path,
    args: list[str],
    nproc: int,
    timeout: float,
    env: dict[str, str] | None = None,
    *,
    check: bool = True,
    announce: bool | None = None,
) -> subprocess.CompletedProcess:
    """Run a probe on ``nproc`` CPU processes and wait: ``target`` is a module (``smolfsdp.probes.x``, run
    with ``-m``) or a script path; the probes write their results to files named in ``args``. GPUs are
    hidden from the ranks (:func:`cpu_probe_env`), also where ``env`` names some.

    Returns the finished process (output captured). With ``check`` (the default) raises RuntimeError naming
    ``what``, the exit code and the last 3,000 characters of stdout and stderr when it fails, so a chapter
    never reads half-written files; ``check=False`` returns a failed process too. ``announce`` prints one line
    saying what starts (``None``: inside a Jupyter kernel, :func:`smolfsdp.launch.progress.in_notebook`), so a
    chapter's probe cell is not silent until its table; the output itself stays captured. Inside a kernel a
    line every ``progress.HEARTBEAT_S`` seconds says it still runs (``progress.heartbeat``). Both go to
    ``progress.live_say``: in a chapter seen while the cell runs, gone from the saved page.
    """
    say = live_say()  # in a kernel the cell's live display, emptied when the cell ends: never on the page
    if in_notebook() if announce is None else announce:
        say(f"{what}: starting {nproc} CPU rank{'' if nproc == 1 else 's'} (torchrun, gloo)")
    cmd = torchrun_command(nproc, args, module=str(target))
    if not str(target).startswith("smolfsdp."):  # a script path: torchrun takes it without its -m
        del cmd[cmd.index(str(target)) - 1]
    # torchrun and its ranks in a process group of their own: a timeout or Ctrl-C stops all of them;
    # GPUs hidden: the probes shard on CPU on purpose, also on a GPU box
    with heartbeat(what, HEARTBEAT_S if in_notebook() else None, say):  # the output comes only at the end
        proc = run_group(
            cmd, env={**cpu_probe_env(nproc), **(env or {}), "CUDA_VISIBLE_DEVICES": ""}, timeout=timeout
        )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def read_results(out_dir: str | Path, name: str, nproc: int | None = None) -> Any:
    """What a probe's ranks wrote into ``out_dir``: the JSON file ``name`` (rank 0's), or with ``nproc``
    every rank's ``name.format(rank=r)`` as a list, by rank. Raises FileNotFoundError for a missing file."""
    out_dir = Path(out_dir)
    if nproc is None:
        return json.loads((out_dir / name).read_text())
    return [json.loads((out_dir / name.format(rank=r)).read_text()) for r in range(nproc)]


def probe_main(
    record: Callable[..., object], description: str | None, argv: list[str] | None = None, **options: dict
) -> None:
    """A probe module's entry point on each rank (``python -m smolfsdp.probes.x --out DIR``, what
    :func:`run_probe` starts): parse ``--out DIR`` (created if missing) and ``options`` (flag name ->
    ``argparse`` keywords: ``fsdp_version={"type": int}`` is ``--fsdp-version``), then call
    ``record(DIR, **their values)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="folder the ranks write their results to")
    for name, kwargs in options.items():
        parser.add_argument("--" + name.replace("_", "-"), **kwargs)
    values = vars(parser.parse_args(argv))
    out = Path(values.pop("out"))
    out.mkdir(parents=True, exist_ok=True)
    record(out, **values)
