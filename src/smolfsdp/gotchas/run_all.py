"""The seams where FSDP, the Trainer and their neighbours fail, each reproduced and then fixed.

Used by the chapter "Debugging the seams". Every gotcha runs a failing setup and a fixed setup and
returns what happened in each: the exception (type and first line of its message) or the measured
symptom. Distributed gotchas run on 2 gloo ranks in one ``torchrun`` subprocess (never a process
group in the caller); the others run in a plain subprocess.

    smolfsdp gotchas --list
    smolfsdp gotchas --run optimizer_before_sharding [--json]
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m smolfsdp.gotchas.run_all \\
        --ranks tied_embeddings --out runs/gotchas

This module runs them and formats what they did; the catalogue (and ``format_list``, which needs no torch) is
``smolfsdp.gotchas.registry``,
the cases ``smolfsdp.gotchas.cases_distributed`` (2 ranks) and ``smolfsdp.gotchas.cases_local``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from smolfsdp.errors import ConfigError

# importing the case modules attaches their functions to the catalogue's entries (GOTCHAS)
from smolfsdp.gotchas import cases_collectives, cases_distributed, cases_local, cases_reported  # noqa: F401
from smolfsdp.gotchas.cases_local import trackio_form
from smolfsdp.gotchas.registry import (
    CRASH,
    DIST,
    GOTCHAS,
    KIND_LEGEND,
    LOCAL,
    GotchaResult,
    format_list,
)
from smolfsdp.launch.probe import read_results, run_probe
from smolfsdp.launch.progress import HEARTBEAT_S, heartbeat
from smolfsdp.measure.results import versions
from smolfsdp.sharding.distributed import init_distributed, teardown


def _launch(
    names: list[str], out: Path, nproc: int, extra: list[str] = (), check: bool = False
) -> subprocess.CompletedProcess:
    """The distributed gotchas ``names`` on ``nproc`` ranks (this module's ``--ranks``), through the probes'
    launcher (GPUs hidden: they shard on CPU on purpose); results in ``out``. A failed launch is returned
    unless ``check`` (the crash form reads its ranks' exit codes)."""
    args = ["--ranks", ",".join(names), "--out", str(out), *extra]
    env = {"SMOLFSDP_GOTCHA_OUT": str(out)}
    return run_probe(  # not announced: run_gotchas says what starts (its progress)
        f"gotchas {names}", "smolfsdp.gotchas.run_all", args, nproc, 900, env=env, check=check, announce=False
    )


def _crash_form(out: Path, offload: bool) -> dict[str, Any]:
    name = "fsdp1_cpu_offload_state_dict"
    proc = _launch(
        [name], out / ("offload" if offload else "no_offload"), 2, ["--offload"] if offload else []
    )
    found = re.findall(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", proc.stdout + proc.stderr, re.S)
    res = {"outcome": "ok" if proc.returncode == 0 else "crash", "torchrun_returncode": proc.returncode}
    if found:  # torchrun's failure summary: the first failure (root cause) is listed last
        res["rank_exit_codes"] = {f"rank{r}": int(c) for r, c in found}
    if proc.returncode == 0:
        res.update(read_results(out / ("no_offload" if not offload else "offload"), f"{name}.json"))
    return res


def run_gotchas(
    names: list[str] | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, GotchaResult]:
    """Run gotchas (all by default) in subprocesses; return their results by name, in registry order.

    ``out``: the folder their runs and result files go to, kept; by default a temporary folder removed
    before this returns (the results hold everything the chapter shows). ``progress`` (the CLI passes a
    printer) is told what starts: the 2-rank launch, then each local gotcha (with a "still running" line every
    HEARTBEAT_S seconds while one runs), each launch of a crashing one."""
    say = progress or (lambda _msg: None)

    names = list(GOTCHAS) if names is None else names
    unknown = [n for n in names if n not in GOTCHAS]
    if unknown:
        raise ConfigError(f"unknown gotcha(s) {unknown}; known: {list(GOTCHAS)}")
    if out is None:
        with tempfile.TemporaryDirectory(prefix="smolfsdp-gotchas-") as tmp:
            return run_gotchas(names, tmp, progress)  # progress too: the chapter's cell says each launch
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw: dict[str, dict[str, Any]] = {}
    dist_names = [n for n in names if GOTCHAS[n].kind == DIST]
    if dist_names:
        say(f"running {', '.join(dist_names)} on 2 ranks (one torchrun launch, both forms each)")
        _launch(dist_names, out, 2, check=True)
        raw.update({n: read_results(out, f"{n}.json") for n in dist_names})
    for n in names:
        g = GOTCHAS[n]
        if g.kind != DIST:
            say(f"running {n} ({KIND_LEGEND[g.kind]})")
        if g.kind == LOCAL:  # its output captured here (tracker_wrong_project: two Trainer runs, ~18 s)
            with heartbeat(n, HEARTBEAT_S if progress else None, say):
                raw[n] = g.fn(out / n)
        elif g.kind == CRASH:
            failing = _crash_form(out / n, True)
            say(f"running {n}: its fixed form (a second launch)")
            raw[n] = {"failing": failing, "fixed": _crash_form(out / n, False)}
    vers = versions()
    raw = _without_machine_paths(raw, out)
    return {
        n: GotchaResult(
            n, GOTCHAS[n].title, raw[n]["failing"], raw[n]["fixed"], GOTCHAS[n].explanation, vers,
            seed_fix=raw[n].get("seed_fix"), thread=GOTCHAS[n].thread,
        )
        for n in names
    }  # fmt: skip


def _without_machine_paths(value: Any, out: Path) -> Any:
    """``value`` with the run folder's absolute path cut from every string (paths read relative to ``out``):
    a message quoted on the page names ``checkpoint_disk_full/...``, not this machine's temporary folder."""
    if isinstance(value, str):
        for folder in {str(out), str(out.resolve())}:
            value = value.replace(folder.rstrip("/") + "/", "").replace(folder, ".")
        return value
    if isinstance(value, dict):
        return {k: _without_machine_paths(v, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_machine_paths(v, out) for v in value]
    return value


def summary_frame(results: dict[str, GotchaResult]):
    """One row per gotcha: what the failing and the fixed form did (exception type or outcome)."""

    def said(d):
        return d.get("error") or d["outcome"]

    rows = [{"gotcha": r.name, "failing": said(r.failing), "fixed": said(r.fixed)} for r in results.values()]
    return pd.DataFrame(rows)


def format_result(r: GotchaResult, width: int = 60) -> str:
    """The failing and fixed forms side by side, then the explanation (plain text for the chapter)."""

    def lines(d):
        return [ln for k, v in d.items() for ln in textwrap.wrap(f"{k}: {v}", width - 2) or [""]]

    left, right = lines(r.failing), lines(r.fixed)
    rows = [f"{'FAILING':<{width}}| FIXED", "-" * width + "+" + "-" * width]
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        rows.append(f"{a:<{width}}| {b}")
    if r.seed_fix is not None:  # the seed's own fix, run too: said under the table (it may fail)
        said = "; ".join(f"{k}: {v}" for k, v in r.seed_fix.items())
        rows += ["", *textwrap.wrap(f"THE SEED'S FIX: {said}", 2 * width)]
    return f"== {r.title} ({r.name})\n" + "\n".join(rows) + "\n\n" + textwrap.fill(r.explanation, 2 * width)


def _main_ranks(names: list[str], out: Path, offload: bool) -> None:
    info = init_distributed()
    for name in names:
        g = GOTCHAS[name]
        args = (offload,) if g.kind == CRASH else ()
        result = g.fn(info.rank, info.world_size, *args)
        torch.distributed.barrier()
        if info.rank == 0:
            (out / f"{name}.json").write_text(json.dumps(result, default=str))
    teardown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="smolfsdp gotchas", description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="list the gotchas")
    p.add_argument("--run", default=None, help="a gotcha name, several joined by commas, or 'all'")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--out", default=None, help="folder for the results and the runs' files")
    p.add_argument("--offload", action="store_true", help=argparse.SUPPRESS)
    # torchrun reads "--run" as its own "--run-path", so launched ranks get the names as --ranks
    p.add_argument("--ranks", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trackio-form", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trackio_form:
        trackio_form(args.trackio_form, Path(args.out))
        return 0
    if args.ranks:  # inside torchrun: be one of the 2 ranks
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        _main_ranks(args.ranks.split(","), out, args.offload)
        return 0
    names = None if args.run in (None, "all") else args.run.split(",")
    if args.list or args.run is None:
        print(format_list(as_json=args.json))
        return 0
    results = run_gotchas(
        names, args.out, lambda msg: print(f"[smolfsdp] {msg}", file=sys.stderr, flush=True)
    )
    if args.json:
        print(json.dumps({n: asdict(r) for n, r in results.items()}, indent=2, default=str))
    else:
        print("\n\n".join(format_result(r) for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
