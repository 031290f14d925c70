"""Start a run's processes in a subprocess with ``torchrun``, on one node or several, and explain failures.

Chapters and ``smolfsdp train`` call this; nothing creates a process group inside a notebook
kernel. The resolved config travels as a YAML file, so each rank sees exactly what was checked.

``nproc`` is the **total** number of processes (the world size); with ``nnodes`` nodes each node
starts ``nproc // nnodes`` of them, so ``nnodes`` must divide ``nproc``. The exact commands:

    # one node, 2 processes (what `smolfsdp train` runs)
    python -m torch.distributed.run --standalone --nproc-per-node=2 -m smolfsdp.cli train --config C
    # 2 nodes x 8 GPUs: the same line on every node, NODE_RANK 0 on the node that hosts the rendezvous
    smolfsdp train --config C --nproc 16 --nnodes 2 --node-rank $NODE_RANK --rdzv-endpoint node0:29400
    # which runs, on each node:
    python -m torch.distributed.run --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=node0:29400 --rdzv-id=smolfsdp-<name> --rdzv-conf=join_timeout=300,... \
        --max-restarts=0 -m smolfsdp.cli train --config C
    # elastic: restart the whole worker group up to 3 times; each restart resumes from the latest checkpoint
    smolfsdp train --config C --save_steps 50 --max-restarts 3

When the run fails, :func:`smolfsdp.launch.failures.explain_failure` turns torchrun's ``ChildFailedError`` report into one
line: which rank died, how (exit code or signal), the last complete checkpoint and the command that
resumes from it; a rendezvous that timed out (nodes that never all joined) is named as such.
:func:`redact` keeps tokens and secrets out of every file a run writes for people; the ranks themselves
read the unredacted config from a private temporary file that is removed when the run ends.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from smolfsdp.checkpoint.dcp import latest_checkpoint
from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch.accelerate_launch import accelerate_command
from smolfsdp.launch.failures import explain_failure
from smolfsdp.launch.host_checks import check_resources, run_lock
from smolfsdp.launch.processes import spawn, stop_group
from smolfsdp.launch.rank_env import FLIGHT_RECORDER_ENTRIES, THREADS_NOTE, launch_env  # noqa: F401 (re-exported)
from smolfsdp.paths import pid_alive


# ------------------------------------------------------------------------------ commands
def torchrun_command(
    nproc: int,
    args: list[str],
    module: str = "smolfsdp.cli",
    *,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "smolfsdp",
    is_host: bool | None = None,
    max_restarts: int = 0,
    rdzv_timeout_s: float | None = None,
) -> list[str]:
    """The ``python -m torch.distributed.run ... -m <module> <args>`` command for one node.

    Args:
        nproc: processes **on this node** (torchrun's ``--nproc-per-node``).
        nnodes: 1 gives ``--standalone`` (a private rendezvous on a free local port); more gives a
            ``c10d`` rendezvous at ``rdzv_endpoint`` (``host:port``) that every node joins with the same
            ``rdzv_id``. torchrun assigns global ranks as nodes join (``--node-rank`` is used only by the
            ``static`` backend, so it is not passed).
        is_host: ``True`` on the node that serves the rendezvous store, ``False`` elsewhere, ``None``:
            torchrun decides by matching the endpoint's host against this machine's names.
        max_restarts: how often torchrun restarts the whole worker group after a worker fails.
        rdzv_timeout_s: ``join_timeout`` (whole rendezvous) and ``read_timeout`` (store connect and
            reads), so a node whose peers never come fails instead of waiting for torch's 600 s default.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ConfigError(
                f"nnodes={nnodes} needs rdzv_endpoint=host:port (the node that hosts the rendezvous)."
            )
        cmd += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id}",
        ]
        conf = []
        if rdzv_timeout_s is not None:
            t = max(1, round(rdzv_timeout_s))
            conf += [f"join_timeout={t}", f"read_timeout={t}"]
        if is_host is not None:
            conf.append(f"is_host={str(is_host).lower()}")
        if conf:
            cmd.append("--rdzv-conf=" + ",".join(conf))
    cmd += [f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    return [*cmd, "-m", module, *args]


def command_for(cfg: TrainConfig, args: list[str], module: str = "smolfsdp.cli") -> list[str]:
    """:func:`torchrun_command` with this node's share of ``cfg.nproc`` and ``cfg``'s rendezvous settings."""
    return torchrun_command(
        cfg.nproc // cfg.nnodes,
        args,
        module,
        nnodes=cfg.nnodes,
        rdzv_endpoint=cfg.rdzv_endpoint,
        rdzv_id=f"smolfsdp-{cfg.name}",
        is_host=(cfg.node_rank == 0) if cfg.nnodes > 1 else None,
        max_restarts=cfg.max_restarts,
        rdzv_timeout_s=cfg.rdzv_timeout_s,
    )


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"node0:29400"`` -> ``("node0", 29400)``; ``"[::1]:29400"`` for IPv6. ConfigError otherwise."""
    host, sep, port = str(endpoint).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"rdzv_endpoint={endpoint!r} is not host:port (e.g. node0:29400 or 10.0.0.1:29400)."
        )
    return host, int(port)


def wait_for_endpoint(
    endpoint: str, timeout_s: float, poll_s: float = 1.0, report_every_s: float = 30.0
) -> None:
    """TCP-connect to the rendezvous ``endpoint`` every ``poll_s`` seconds until it answers or ``timeout_s``
    passes.

    Run on every node but the host before torchrun starts. Node 0 may legitimately start later than
    this node, so a refused or unreachable endpoint is retried for the whole ``timeout_s`` (the run's
    ``rdzv_timeout_s``, 300 s by default), not given up at once. It says so on stderr: one line when it
    starts waiting and one every ``report_every_s`` seconds while it retries (with the last error), and
    it then fails with the address named, instead of deep inside torch's store client.

    Raises:
        ConfigError: nothing accepted a connection at ``host:port`` within ``timeout_s``.
    """
    host, port = parse_endpoint(endpoint)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    next_report = t0 + report_every_s
    last: OSError | None = None
    first = True
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, left))):
                return
        except OSError as err:
            last = err
        now = time.monotonic()
        if first:
            first = False
            print(
                f"[smolfsdp] waiting up to {timeout_s:g} s for the rendezvous endpoint {host}:{port} served by "
                f"node_rank 0 ({last}); start node 0 if it is not running yet",
                file=sys.stderr,
                flush=True,
            )
        elif now >= next_report:
            while next_report <= now:  # on a fixed schedule: t0 + report_every_s, t0 + 2 report_every_s, ...
                next_report += report_every_s
            print(
                f"[smolfsdp] still waiting for {host}:{port}: {now - t0:.0f} of {timeout_s:g} s ({last})",
                file=sys.stderr,
                flush=True,
            )
        if now + poll_s > deadline:
            break
        time.sleep(poll_s)
    raise ConfigError(
        f"The rendezvous endpoint {host}:{port} did not answer within {timeout_s:g} s ({last}). Start node_rank "
        "0 first (it serves the rendezvous), check the address and port, and that no firewall blocks it; "
        "raise rdzv_timeout_s if node 0 starts slowly."
    )


# ------------------------------------------------------------------------------ running
TMP_PREFIX = "smolfsdp-"  # + launcher pid + "-": the private folder of the ranks' unredacted config.yaml


def remove_stale_configs(base: str | Path | None = None) -> list[Path]:
    """Remove ``smolfsdp-<pid>-*`` folders in ``base`` (the temporary folder) that a launcher of this
    user made and whose process ``<pid>`` is gone (a SIGKILL skips the cleanup); returns them. A folder
    holding anything but ``config.yaml`` is not ours and is kept."""
    removed = []
    for folder in sorted(Path(base or tempfile.gettempdir()).glob(f"{TMP_PREFIX}*-*")):
        pid = folder.name[len(TMP_PREFIX) :].split("-", 1)[0]
        try:
            ours = folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid()
            ours = ours and pid.isdigit() and {p.name for p in folder.iterdir()} <= {"config.yaml"}
        except OSError:
            continue
        if not ours or pid_alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def launch(
    cfg: TrainConfig,
    *,
    capture: bool = False,
    timeout: float | None = None,
    accelerate_config: str | Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``smolfsdp train`` on this node's ``cfg.nproc // cfg.nnodes`` processes and wait for it.

    The combined output streams to this process's ``sys.stdout``; with ``capture`` it is also
    returned in ``.stdout`` (for notebooks and tests). ``on_line`` is called with each line of that output
    (a progress bar's ``\r`` updates each count as a line) as it arrives, in this thread (so a notebook cell
    shows what it prints while the run goes on). A failed run ends with one line from
    :func:`explain_failure` (on stderr, and at the end of ``.stdout`` when capturing). With
    ``accelerate_config`` the processes are started by ``accelerate launch --config_file`` (which runs
    torch.distributed.run itself) instead of torchrun: :func:`smolfsdp.launch.accelerate_launch.check_accelerate_config` first.

    Raises:
        ConfigError: on a node other than node_rank 0, the rendezvous endpoint did not answer; more ranks
            than this node's GPUs, cores or memory allow (:func:`smolfsdp.launch.host_checks.check_resources`);
            the same run (name and output_dir) is already running (:func:`smolfsdp.launch.host_checks.run_lock`).
        Terminated: SIGTERM reached the launcher (a ``KeyboardInterrupt``, like Ctrl-C): the ranks were
            stopped and the temporary config removed first.
    """
    if cfg.nnodes > 1 and cfg.node_rank > 0:
        wait_for_endpoint(cfg.rdzv_endpoint, cfg.rdzv_timeout_s)
    check_resources(cfg)
    # held for the run's life: a second launch of this name and output_dir is refused, not interleaved
    remove_stale_configs()  # a SIGKILLed launcher's unredacted config (its process gone)
    tmp_dir = tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-")
    with run_lock(cfg), sigterm_as_interrupt(), tmp_dir as tmp:
        cfg_path = Path(tmp) / "config.yaml"
        # the ranks train with the config as resolved; redaction is for the files people read (the
        # run folder's and each checkpoint's config.yaml); this private folder is removed afterwards
        cfg.save(cfg_path, redact_secrets=False)
        cmd = command_for(cfg, ["train", "--config", str(cfg_path)])
        if accelerate_config is not None:
            cmd = accelerate_command(cfg, accelerate_config, ["train", "--config", str(cfg_path)])
        env = launch_env(cfg.nproc // cfg.nnodes, cfg.max_restarts)
        note = f"[smolfsdp] {env[THREADS_NOTE]}"  # the threads each rank gets, and why: once per node
        if not capture:
            print(note, file=sys.stderr, flush=True)
        elif on_line:
            on_line(note)
        proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # its own process group
        try:  # from the moment torchrun exists: a signal in any later line must still stop it
            lines = queue.Queue() if on_line else None
            out = _Tee(proc.stdout, echo=not capture, keep_all=capture, lines=lines)
            _wait(proc, timeout, lines, on_line)
        except BaseException as err:
            # Ctrl-C, SIGTERM, a timeout or any error here: pass SIGINT on so torchrun stops its workers
            # (subprocess.run would SIGKILL torchrun and leave the ranks training as orphans).
            stop(proc)
            if isinstance(err, subprocess.TimeoutExpired):
                err.output = out.join()  # what the run printed before it timed out
            raise
        text = (note + "\n" if capture else "") + out.join()
        _drain(lines, on_line)  # what the pump read after the last poll
    if proc.returncode != 0:
        line = "[smolfsdp] " + explain_failure(text, proc.returncode, cfg)
        print(line, file=sys.stderr, flush=True)
        text += "\n" + line + "\n"
    return subprocess.CompletedProcess(cmd, proc.returncode, text if capture else None, None)


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the launcher; raised like Ctrl-C's KeyboardInterrupt so it is handled the same way."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the block runs (in the main thread), SIGTERM raises :class:`Terminated`, so :func:`launch`
    stops torchrun and its ranks and removes its temporary config as it does for Ctrl-C. A second SIGTERM
    during that stop is ignored: cutting the stop short would leave ranks running."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(f"the launcher received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drain(lines: queue.Queue | None, on_line: Callable[[str], None] | None) -> None:
    while lines is not None and on_line is not None and not lines.empty():
        on_line(lines.get_nowait())


def _wait(proc: subprocess.Popen, timeout: float | None, lines, on_line, poll_s: float = 0.2) -> int:
    """``proc.wait(timeout)``, handing the lines the pump has read to ``on_line`` every ``poll_s`` meanwhile;
    raises ``subprocess.TimeoutExpired`` as ``wait`` does."""
    if lines is None:
        return proc.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        _drain(lines, on_line)
        left = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
        try:
            return proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout) from None


class _Tee:
    """Copy a child's output to ``sys.stdout`` (``echo``) while keeping it (all, or the last 1 MB); with
    ``lines``, also put each finished line (ended by ``\n`` or ``\r``) on that queue."""

    def __init__(self, stream, echo: bool, keep_all: bool, tail_bytes: int = 1 << 20, lines=None):
        self.stream, self.echo, self.keep_all, self.tail_bytes = stream, echo, keep_all, tail_bytes
        self.buf, self.lines, self.pending = bytearray(), lines, ""
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := self.stream.read1(1 << 16):
            text = decoder.decode(chunk)
            if self.echo:
                sys.stdout.write(text)
                sys.stdout.flush()
            if self.lines is not None:
                *done, self.pending = re.split(r"[\r\n]", self.pending + text)
                for line in done:
                    if line.strip():
                        self.lines.put(line)
            self.buf += chunk
            if not self.keep_all and len(self.buf) > 2 * self.tail_bytes:
                del self.buf[: -self.tail_bytes]
        if self.lines is not None and self.pending.strip():
            self.lines.put(self.pending)

    def join(self, timeout_s: float = 30.0) -> str:
        self.thread.join(timeout_s)
        return self.buf.decode("utf-8", errors="replace")


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGINT torchrun (it forwards it to every rank and waits for them), then SIGTERM and SIGKILL to its
    whole process group (:func:`smolfsdp.launch.processes.stop_group`), so no rank outlives it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    stop_group(proc)


def resume_on_restart(cfg: TrainConfig, env: dict[str, str] | None = None) -> TrainConfig:
    """Inside a rank: after an elastic restart (``TORCHELASTIC_RESTART_COUNT`` > 0) continue from the latest
    complete checkpoint of this run; with none yet, start the run over in its own folder."""
    env = os.environ if env is None else env
    if int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) == 0:
        return cfg
    if latest_checkpoint(cfg.run_dir) is not None:
        return cfg.replace(resume_from="latest")
    if cfg.resume_from:
        return cfg
    return cfg.replace(overwrite=True)
