"""What a captured run shows while it goes on: rank 0's own lines and its progress bar, fit for a book page.

:func:`rank0_progress` is the line filter ``launch.runner.run(capture=True, progress=...)`` hands every line
of output to. The pages the chapters become are read elsewhere, so each line it passes is first made
page-safe (:func:`page_line`): paths under the repository (or another root, such as the run's output
folder) are printed relative to it (``runs/book/05_profiling/bench_fsdp1/traces``, not this machine's
absolute path), and a third-party warning line (:func:`smolfsdp.quiet.is_third_party_warning`) is not
passed at all. Nothing is lost: the captured log (``Run.log``) keeps every line as the ranks printed it;
smolfsdp's own lines and errors are always passed.

Inside a Jupyter kernel (:func:`in_notebook`) ``run`` streams this way by default, so no chapter cell
waits for minutes in silence. Where the lines go is :func:`live_say`: in a kernel, one display per cell that
each line updates (the last :data:`LIVE_LINES` lines shown) and that is emptied when the cell ends
(:class:`LiveLines`), so progress is seen while a cell runs and the saved notebook, hence the rendered page,
keeps none of it; elsewhere the terminal, as ``print``.

    from smolfsdp.launch.progress import rank0_progress
    show = rank0_progress()   # print rank 0's lines, the bar every 9 s
    show("[rank0] 10:16:00 smolfsdp.train.native: checkpoint /home/me/smolfsdp/runs/x/checkpoints/step-3")
    # -> [rank0] 10:16:00 smolfsdp.train.native: checkpoint runs/x/checkpoints/step-3
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections import deque
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


#: how many of the latest progress lines a cell's live display shows while the cell runs
LIVE_LINES = 6
#: the output metadata key Quarto reads to leave an output off the page (quarto-cli
#: ``src/core/jupyter/jupyter.ts``: ``kQuartoOutputDisplay``; an output whose value is false is skipped)
QUARTO_DISPLAY = "quarto_display"
#: what an emptied display holds: no text, and a mark that tells Quarto not to draw it
EMPTY = ({"text/plain": ""}, {QUARTO_DISPLAY: False})


class LiveLines:
    """Progress lines of one notebook cell, shown in one display that each line updates and that
    :meth:`clear` empties.

    nbclient (what papermill, Quarto and ``smolfsdp.book.chapters.execute_chapter`` execute chapters with)
    stores a display once and applies each ``update_display_data`` to that stored output
    (``NotebookClient._update_display_id``), so only the last state is saved: emptied, nothing of the
    progress is left in the notebook, while a reader's Jupyter shows every update live. ``display`` is
    IPython's (``IPython.display.display``); the display is made at the first line, so a cell that says
    nothing gets no output. Lines may come from a heartbeat thread: one lock orders them.
    """

    def __init__(self, display: Callable, keep: int = LIVE_LINES):
        self._display, self.lines = display, deque(maxlen=keep)
        self.handle, self.said, self._lock = None, 0, threading.Lock()

    def say(self, line: str) -> None:
        """Show ``line`` below the previous ones (the last ``keep`` lines are shown)."""
        with self._lock:
            self.lines.extend(str(line).splitlines() or [""])
            self.said += 1
            self._show({"text/plain": "\n".join(self.lines)}, {})

    def clear(self) -> None:
        """Empty the display (:data:`EMPTY`): what the saved notebook keeps of it."""
        with self._lock:
            self.lines.clear()
            if self.handle is not None:
                self.handle.update(EMPTY[0], raw=True, metadata=EMPTY[1])

    def _show(self, data: dict, metadata: dict) -> None:
        if self.handle is None:
            self.handle = self._display(data, raw=True, metadata=metadata, display_id=True)
        else:
            self.handle.update(data, raw=True, metadata=metadata)


_live: dict[str, LiveLines | None] = {"cell": None}


def _kernel_shell():
    """IPython's shell when this process is a Jupyter kernel that can display (a real ``ipykernel`` shell),
    else None: a plain Python, or a test that only puts a module named ipykernel in ``sys.modules``."""
    if not in_notebook():
        return None
    from IPython import get_ipython  # deferred: IPython is there only inside a kernel

    shell = get_ipython()
    return shell if getattr(shell, "kernel", None) is not None else None


def live_say() -> Callable[[str], None]:
    """Where a progress line goes. Inside a Jupyter kernel: the running cell's :class:`LiveLines` (made at the
    first call of a cell, emptied when the cell ends: IPython's ``post_run_cell`` event, also after an error),
    so nothing of it reaches the saved notebook. Elsewhere: ``print`` with flush, to the terminal."""
    shell = _kernel_shell()
    if shell is None:
        return lambda line: print(line, flush=True)
    if _live["cell"] is None:
        from IPython.display import display  # deferred: IPython is there only inside a kernel

        lines = _live["cell"] = LiveLines(display)

        def cell_ended(*_result) -> None:
            shell.events.unregister("post_run_cell", cell_ended)
            lines.clear()
            _live["cell"] = None

        shell.events.register("post_run_cell", cell_ended)
    return _live["cell"].say


def note(line: str) -> None:
    """Say ``line`` through :func:`live_say`: in a chapter, seen while the cell runs ("importing torch ..."), gone
    from the page."""
    live_say()(line)


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
    (default: :func:`live_say`) as they come, and a progress bar's latest state at most every ``every_s`` seconds and
    when it reaches 100 %, so a notebook cell shows a run's progress while it trains. Other ranks' lines and
    library noise stay in the captured log only: a third-party warning line (and the source line a
    ``warnings.warn`` report echoes after it) is never passed, smolfsdp's own lines always are. Paths under
    ``roots`` (default: the repository), then under the interpreter's prefixes, are shown relative to them
    (:func:`page_line`)."""
    say = say or live_say()
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
    """While the block runs, say ``"<what>: still running, <t> s"`` from a daemon thread whenever nothing was
    said for ``every_s`` seconds, for a wait whose output is captured until it ends (a probe's ranks);
    ``every_s`` 0 or None: nothing. Lines passed through :meth:`relay` (a streamed run's own lines) are said
    at once and restart the count, so the heartbeat only fills the silences between them (a launched rank's
    start-up: 7-15 s on two busy cores before its first log line, issue 33). ``say`` (default: :func:`live_say`,
    resolved here, in the caller's thread): in a chapter the cell's live display, gone from the page when the
    cell ends."""

    def __init__(
        self, what: str, every_s: float | None = HEARTBEAT_S, say: Callable[[str], None] | None = None
    ):
        self.what, self.every_s, self.say = what, every_s, say or live_say()
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
