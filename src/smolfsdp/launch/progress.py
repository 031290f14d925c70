"""What a captured run shows while it goes on: rank 0's own lines and its progress bar, fit for a book page.

:func:`rank0_progress` is the line filter ``launch.runner.run(capture=True, progress=...)`` hands every line
of output to. The pages the chapters become are read elsewhere, so each line it passes is first made
page-safe (:func:`page_line`): paths under the repository (or another root, such as the run's output
folder) are printed relative to it (``runs/book/05_profiling/bench_fsdp1/traces``, not this machine's
absolute path), and a third-party warning line (:func:`smolfsdp.quiet.is_third_party_warning`) is not
passed at all. Nothing is lost: the captured log (``Run.log``) keeps every line as the ranks printed it;
smolfsdp's own lines and errors are always passed.

Inside a Jupyter kernel (:func:`in_notebook`) ``run`` streams this way by default, so no chapter cell
waits for minutes in silence.

    from smolfsdp.launch.progress import rank0_progress
    show = rank0_progress()   # print rank 0's lines, the bar every 9 s
    show("[rank0] 10:16:00 smolfsdp.train.native: checkpoint /home/me/smolfsdp/runs/x/checkpoints/step-3")
    # -> [rank0] 10:16:00 smolfsdp.train.native: checkpoint runs/x/checkpoints/step-3
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from smolfsdp.paths import repo_root
from smolfsdp.quiet import is_third_party_warning

#: a progress bar's state in a line of output (tqdm: ``train:  33%|███▎      | 1/3 [00:01<00:02, ...]``)
_BAR = re.compile(r"\d+%\|")
#: a bar's state and what follows it on the same line: a rank's stderr writes after the bar's last ``\r``
#: without a newline (a torch ``UserWarning`` glued to ``train:  50%|█████     | 3/6 [00:02<00:02, loss=6.805]``)
_BAR_AND_REST = re.compile(r"^(.*?\d+%\|[^\[]*\[[^\]]*\])(.+)$")
#: the first line of a ``warnings.warn`` report (``/x/y.py:12: FutureWarning: ...``); the next, indented line
#: echoes the source line that warned and belongs to it
_WARN_HEADER = re.compile(r":\d+: \w*Warning: ")


def in_notebook() -> bool:
    """True inside a Jupyter kernel (``ipykernel`` loaded, as tqdm.auto decides): where a captured run shows
    its progress by default."""
    return "ipykernel" in sys.modules


def _forms(root: str | Path) -> list[str]:
    """``root`` as given and resolved (``/tmp`` may be a link), without a trailing slash, longest first."""
    given = str(root).rstrip("/")
    return sorted({given, str(Path(root).resolve()).rstrip("/")}, key=len, reverse=True)


def page_line(line: str, roots: Iterable[str | Path]) -> str:
    """``line`` with every path under one of ``roots`` written relative to it, the first root that matches
    winning (give the repository first: ``runs/book/...`` reads better than a bare run name); a root
    itself becomes ``.``."""
    for root in roots:
        for form in _forms(root):
            if len(form) > 1:  # never "/" itself
                line = re.sub(re.escape(form) + r"(/|(?![\w.-]))", lambda m: "" if m[1] == "/" else ".", line)
    return line


#: seconds between two lines of :func:`heartbeat`, and at most between two states of a run's progress bar that
#: :func:`rank0_progress` shows (under the issue-33 bar: no cell silent for 10 s; at 10 s the bar's next state
#: came 10.1 s after the last on a busy machine)
HEARTBEAT_S = 9.0


def rank0_progress(
    say: Callable[[str], None] | None = None,
    every_s: float = HEARTBEAT_S,
    clock: Callable[[], float] = time.monotonic,
    roots: Iterable[str | Path] | None = None,
) -> Callable[[str], None]:
    """A line filter for ``runner.run``'s ``progress``: passes rank 0's log lines (``[rank0] ...``) on to ``say``
    (default: ``print``) as they come, and a progress bar's latest state at most every ``every_s`` seconds and
    when it reaches 100 %, so a notebook cell shows a run's progress while it trains. Other ranks' lines and
    library noise stay in the captured log only: a third-party warning line (and the source line a
    ``warnings.warn`` report echoes after it) is never passed, smolfsdp's own lines always are. Paths under
    ``roots`` (default: the repository), then under the interpreter's prefixes, are shown relative to them
    (:func:`page_line`)."""
    say = say or (lambda line: print(line, flush=True))
    # then the interpreter's folders: a traceback's "/…/site-packages/torch/…" reads "lib/python3.11/site-packages/…"
    roots = [*([repo_root()] if roots is None else roots), sys.prefix, sys.base_prefix]
    last, finished, after_warning = [-math.inf], [""], [False]

    def show(text: str) -> None:
        say(page_line(text, roots))

    def on_line(line: str) -> None:
        glued = _BAR_AND_REST.match(line.strip())
        if glued:  # the bar, then the rest as a line of its own
            on_line(glued[1])
            on_line(glued[2])
            return
        text = line.strip()
        if after_warning[0]:
            after_warning[0] = False
            if line.removeprefix("[rank0]:")[:1].isspace():
                return  # the source line a warnings.warn report echoes
        if is_third_party_warning(text):
            after_warning[0] = bool(_WARN_HEADER.search(text))
            return  # kept in the captured log, not on the page
        if not _BAR.search(text):
            if text.startswith("[rank0]"):
                show(text)
            return
        if text.startswith("[rank") and not text.startswith("[rank0]"):
            return  # another rank's bar
        now, done = clock(), "100%|" in text
        if done and text.split("%|")[0] == finished[0]:
            return  # tqdm draws its last state again as it closes
        if now - last[0] >= every_s or done:
            last[0], finished[0] = now, text.split("%|")[0] if done else ""
            show(text.removeprefix("[rank0]:").strip())

    return on_line


class heartbeat:  # noqa: N801 - used as a context manager: `with heartbeat("x"):`
    """While the block runs, print ``"<what>: still running, <t> s"`` from a daemon thread whenever nothing was
    said for ``every_s`` seconds, for a wait whose output is captured until it ends (a probe's ranks);
    ``every_s`` 0 or None: nothing. Lines passed through :meth:`relay` (a streamed run's own lines) are said
    at once and restart the count, so the heartbeat only fills the silences between them (a launched rank's
    start-up: 7-15 s on two busy cores before its first log line, issue 33). The lines are ours and carry no
    path, so a page may show them."""

    def __init__(self, what: str, every_s: float | None = HEARTBEAT_S, say: Callable[[str], None] = print):
        import threading  # deferred: a thread only where a wait is long

        self.what, self.every_s, self.say = what, every_s, say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._start = self._last = time.monotonic()

    def relay(self, line: str) -> None:
        """Say ``line`` now (with ``say``); the next heartbeat line comes ``every_s`` seconds after it at the soonest."""
        self._last = time.monotonic()
        self.say(line)

    def _beat(self) -> None:
        while not self._stop.wait(max(0.01, self._last + self.every_s - time.monotonic())):
            now = time.monotonic()
            if now - self._last >= self.every_s:
                self._last = now
                self.say(f"{self.what}: still running, {now - self._start:.0f} s")

    def __enter__(self) -> heartbeat:
        self._start = self._last = time.monotonic()
        if self.every_s:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
