"""Why a launched run failed, in one line: torchrun's ``ChildFailedError`` report and rendezvous errors read.

:func:`explain_failure` names which rank died and how (exit code or signal, or killed by the launcher),
the collective that hung, the newest checkpoint that verifies and the command that resumes from it;
:func:`explain_rendezvous` says what a rendezvous error means for the nodes. Called by
:func:`smolfsdp.launch.torchrun.launch` when the launcher exits non-zero.
"""

from __future__ import annotations

import re
import signal
from typing import Any

from smolfsdp.checkpoint.dcp import checkpoint_dir, missing_final_model, newest_good_checkpoint
from smolfsdp.config import TrainConfig

_FAILURE = re.compile(
    r"host\s*:\s*(?P<host>\S+)\s*\n\s*rank\s*:\s*(?P<rank>-?\d+) \(local_rank: (?P<local>-?\d+)\)\s*\n"
    r"\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)(?: \((?P<sig>\w+)\))?"
)


#: torchrun's line when a rank ignored its closing signal for 30 s and it sent SIGKILL itself
#: (``torch/distributed/elastic/multiprocessing/api.py``, ``_close``).
_LAUNCHER_KILL = re.compile(r"Unable to shutdown process (\d+) via \S+, forcefully exiting via")


def parse_failures(output: str) -> list[dict[str, Any]]:
    """The failed ranks in torchrun's last ``ChildFailedError`` report, as dicts (rank, local_rank, host,
    exitcode, pid, signal, killed_by_launcher). The report's format:
    ``torch/distributed/elastic/multiprocessing/errors``. ``killed_by_launcher``: torchrun sent the SIGKILL
    itself because the rank did not answer its SIGTERM (the rank was stopped or hung; not the OOM killer)."""
    start = output.rfind("Failures:")
    launcher_killed = {int(p) for p in _LAUNCHER_KILL.findall(output)}
    seen, out = set(), []
    for m in _FAILURE.finditer(output, max(start, 0)):
        rank = int(m["rank"])
        if rank in seen:
            continue
        seen.add(rank)
        code = int(m["code"])
        sig = m["sig"] or (
            signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
        )
        out.append(
            {
                "rank": rank,
                "local_rank": int(m["local"]),
                "host": m["host"],
                "exitcode": code,
                "pid": int(m["pid"]),
                "signal": sig,
                "killed_by_launcher": sig == "SIGKILL" and int(m["pid"]) in launcher_killed,
            }
        )
    # the cause first: a rank killed by a signal, then one that exited with an error; last the ranks
    # torchrun itself stopped (SIGTERM/SIGINT, or SIGKILL when they did not answer) because another had failed
    return sorted(out, key=lambda f: (_stopped_by_launcher(f), f["exitcode"] >= 0, f["rank"]))


def _stopped_by_launcher(f: dict[str, Any]) -> bool:
    return f["signal"] in STOP_SIGNALS or f["killed_by_launcher"]


STOP_SIGNALS = ("SIGTERM", "SIGINT")


def explain_failure(output: str, returncode: int, cfg: TrainConfig) -> str:
    """One line for a failed run: which rank died and how, the newest checkpoint that verifies, how to resume.

    ``output`` is torchrun's combined output. A rank killed by a signal is named as the cause; the
    others usually failed because a peer vanished, or were stopped by torchrun (SIGTERM). A collective
    that failed is quoted from the rank's :class:`smolfsdp.sharding.distributed.CollectiveError` (or NCCL's watchdog).
    A rendezvous that timed out, was closed or lost its store (nodes that never all joined, a node that
    ended the run) is explained by :func:`explain_rendezvous`.
    """
    failures = parse_failures(output)
    parts = []
    for i, f in enumerate(failures):
        where = f"local rank {f['local_rank']} on {f['host']}, pid {f['pid']}"
        if f["killed_by_launcher"]:
            parts.append(
                f"rank {f['rank']} ({where}) did not answer the launcher's SIGTERM within 30 s and was killed by "
                "it (SIGKILL): that rank was stopped (SIGSTOP, Ctrl-Z, a debugger) or hung, not out of memory"
            )
        elif f["signal"] in STOP_SIGNALS and i > 0:
            parts.append(f"rank {f['rank']} was stopped by the launcher ({f['signal']})")
        elif f["signal"]:
            hint = (
                " (the out-of-memory killer or the job scheduler sends it)"
                if f["signal"] == "SIGKILL"
                else ""
            )
            parts.append(f"rank {f['rank']} ({where}) was killed by {f['signal']}{hint}")
        else:
            parts.append(f"rank {f['rank']} ({where}) exited with code {f['exitcode']}")
    what = parts[0] if parts else f"the launcher (torchrun) exited with code {returncode}"
    if len(parts) > 1:
        what += "; then " + ", ".join(parts[1:])
    rdzv = explain_rendezvous(output, cfg)
    if rdzv:
        what = rdzv if not parts else f"{what}; then {rdzv}"
    hung = re.findall(r"CollectiveError: (rank \d+ of \d+: .*?\) (?:timed out|failed))", output)
    hung += re.findall(r"(\[Rank \d+\] Watchdog caught collective operation timeout: .*?\))", output)
    if hung:
        what += f"; {hung[0]}"
    # recommend only a checkpoint that verifies (sizes and SHA-256 of every file), never a broken one
    latest, bad = newest_good_checkpoint(checkpoint_dir(cfg.run_dir))
    broken = f" ({bad[0][1]}; {len(bad)} newer checkpoint(s) fail verification)" if bad else ""
    missing = _final_not_written(latest, cfg)
    if missing:  # the kill hit the final save: resuming would train nothing
        then = missing[0].lower() + missing[1:]
    elif latest is not None and not bad:
        then = (
            f"the last complete checkpoint is {latest}; resume with: smolfsdp train <the same flags> --resume"
        )
    elif latest is not None:
        then = (
            f"the newest checkpoint that verifies is {latest}{broken}; resume with: smolfsdp train <the same "
            f"flags> --resume {latest}"
        )
    elif bad:
        then = f"no checkpoint of this run verifies{broken}; the run must start over (--overwrite true)"
    elif rdzv and not parts:  # the ranks never started (or a restarted group never did)
        then = "no checkpoint of this run is complete, so once fixed the same command starts it from step 0"
    elif cfg.save_steps > 0:
        then = "no checkpoint was complete yet; the run must start over (--overwrite true)"
    else:
        then = "no checkpoints were written (save_steps=0); set --save_steps to make a run resumable"
    return f"run {cfg.name!r} failed: {what}. {then}"


def _final_not_written(latest, cfg: TrainConfig) -> str | None:
    """What exists and how to finish when the newest good checkpoint is at the run's last step but no final
    model was written (:func:`smolfsdp.checkpoint.dcp.missing_final_model`); None otherwise."""
    if latest is None or cfg.max_steps <= 0 or not cfg.save_final_model:
        return None
    step = latest.name.split("-")[-1]
    if not step.isdigit() or int(step) < cfg.max_steps:
        return None
    return missing_final_model(cfg.run_dir, latest)


#: c10d's TCPStore when its port is taken: "... failed to listen on any local network address. port: 29400,
#: useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use" (a DistNetworkError that
#: torchrun wraps in a RendezvousConnectionError).
_PORT_IN_USE = re.compile(r"(?:port: (?P<port>\d+)\b[^\n]*)?\bEADDRINUSE\b|address already in use", re.I)
_RDZV_ERROR = re.compile(r"\b(Rendezvous(?:Timeout|Closed|Connection)Error)\b")


def explain_rendezvous(output: str, cfg: TrainConfig) -> str | None:
    """What torchrun's rendezvous error in ``output`` means for ``cfg``'s nodes, or None when there is none.

    torchrun's agent raises these before any rank starts (or before a restarted group starts), so no
    ``ChildFailedError`` report names a rank; the class names are torch's
    (``torch/distributed/elastic/rendezvous/api.py``). The last one in ``output`` is the one that ended
    the launcher (a chained traceback prints its cause first).
    """
    where = f"at {cfg.rdzv_endpoint}" if cfg.rdzv_endpoint else "(local, --standalone)"
    in_use = _PORT_IN_USE.search(output)
    if in_use:
        port = in_use["port"] or (cfg.rdzv_endpoint or "?").rpartition(":")[2]
        return (
            f"the rendezvous store {where} could not listen: port {port} is already in use on this machine "
            "(EADDRINUSE: another run's rendezvous or another program holds it), not a lost connection; choose a "
            "free port in rdzv_endpoint, or end what holds it (ss -ltnp | grep :PORT names it)"
        )
    found = _RDZV_ERROR.findall(output)
    if not found:
        return None
    n = cfg.nnodes
    if found[-1] == "RendezvousTimeoutError":
        return (
            f"the rendezvous {where} timed out after {cfg.rdzv_timeout_s:g} s (rdzv_timeout_s): not all of the "
            f"nnodes={n} nodes joined; start the same command on every node (node_rank 0..{n - 1}) within "
            f"rdzv_timeout_s of each other, and check that {cfg.rdzv_endpoint or 'the endpoint'} is reachable "
            "from each (address, port, firewall)"
        )
    if found[-1] == "RendezvousClosedError":
        return (
            f"the rendezvous {where} was closed by another node: its launcher ended the run (a rank there "
            "failed, or it was stopped); that node's output names the cause"
        )
    return (
        f"the connection to the rendezvous store {where} failed (node_rank 0 stopped, or the network between "
        "the nodes failed); node 0's output names the cause"
    )
