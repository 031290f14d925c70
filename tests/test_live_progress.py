"""Progress is seen while a cell runs and is not page content (issue 41): inside a Jupyter kernel every progress
line (a run's rank-0 lines and tqdm bar, a probe's "starting" and "still running" lines, "importing ..." and
"[dry run] ..." notes) goes to one display per cell that each line updates and that is emptied when the cell
ends, so the executed notebook keeps nothing of it; outside a kernel the lines print as before
(tests/test_run_progress.py, tests/test_probe_launchers.py)."""

import re
import tempfile
import textwrap

import nbformat
from nbclient import NotebookClient

from smolfsdp.book.chapters import _kernel_config, drop_undisplayed_outputs
from smolfsdp.launch import progress
from smolfsdp.paths import repo_root

#: what a progress line looks like on a page: a tqdm bar, a heartbeat, a rank's log line, the notes
PROGRESS = re.compile(
    r"\d+%\||it/s|s/it|still running|\[rank\d\]|\[dry run\]|importing .*\(seconds\)|starting \d CPU rank"
)

CELLS = [
    # a chapter's first cell: a note, then the imports; a real output after it stays
    'from smolfsdp.launch.progress import note\nnote("importing torch and the probes (seconds)")\nprint("kept")',
    # a probe: "starting" then heartbeats while the ranks run (the launch itself stubbed: 0.7 s)
    """
    import subprocess, time
    from smolfsdp.launch import probe
    probe.HEARTBEAT_S = 0.2
    probe.run_group = lambda cmd, **kw: (time.sleep(0.7), subprocess.CompletedProcess(cmd, 0, "", ""))[1]
    probe.run_probe("step probe", "smolfsdp.probes.step", [], 2, 60)
    "probe result"
    """,
    # a run streamed as runner.run streams it in a chapter: rank 0's log lines and tqdm bar
    """
    import types
    from smolfsdp.config import load_config
    from smolfsdp.launch import runner
    LINES = ["[rank0] 10:16:00 smolfsdp.train.native: step 1/6 loss 6.91",
             "train:  50%|█████     | 3/6 [00:02<00:02,  1.50it/s]",
             "[rank1] 10:16:00 smolfsdp.train.native: step 1/6 loss 6.91",
             "train: 100%|██████████| 6/6 [00:04<00:00,  1.50it/s]"]
    def fake_launch(cfg, *, on_line=None, **kw):
        for line in LINES:
            on_line(line)
        return subprocess.CompletedProcess([], 0, "", None)
    runner.preflight, runner.launch = (lambda cfg: {}), fake_launch
    runner.load_run = lambda path: types.SimpleNamespace()
    runner.run(load_config(None), capture=True)
    print("run finished")
    """,
    # a dry run's progress callback, as chapter 00 passes it, then a failing cell: emptied all the same
    'note("[dry run] tracing the step")\nraise ValueError("after the note")',
]


def _execute(cells: list[str]):
    """Run ``cells`` in a real kernel (nbclient, as the chapters run); return the notebook and every
    display message the kernel sent, as ``(cell index, msg_type, text/plain)``."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in cells]
    sent: list[tuple[int, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="smolfsdp-kernel-") as sockets:
        client = NotebookClient(
            nb, timeout=120, kernel_name="python3", allow_errors=True, config=_kernel_config(sockets),
            resources={"metadata": {"path": str(repo_root())}},
        )  # fmt: skip
        process = client.process_message

        def spy(msg, cell, cell_index):
            if msg["msg_type"] in ("display_data", "update_display_data"):
                sent.append((cell_index, msg["msg_type"], msg["content"]["data"].get("text/plain", "")))
            return process(msg, cell, cell_index)

        client.process_message = spy
        client.execute()
    return nb, sent


def _texts(outputs) -> list[str]:
    out = []
    for o in outputs:
        out.append(o.get("text", ""))
        out += [v if isinstance(v, str) else "" for v in o.get("data", {}).values()]
    return out


def test_a_kernel_shows_progress_while_cells_run_and_keeps_none_of_it():
    nb, sent = _execute(CELLS)
    shown = "\n".join(text for _, _, text in sent)
    # while the cells ran: the handle was made once per cell and updated with each line
    for line in (
        "importing torch and the probes (seconds)",
        "step probe: starting 2 CPU ranks (torchrun, gloo)",
        "step probe: still running,",
        "[rank0] 10:16:00 smolfsdp.train.native: step 1/6 loss 6.91",
        "train: 100%|██████████| 6/6",
        "[dry run] tracing the step",
    ):
        assert line in shown, (line, sent)
    assert "[rank1]" not in shown  # other ranks stay in the captured log
    assert [kind for i, kind, _ in sent if i == 1].count("display_data") == 1  # one display per cell, updated
    assert sum(kind == "update_display_data" for i, kind, _ in sent if i == 1) >= 3
    # what the notebook keeps: each display emptied and marked for Quarto to skip, the real outputs intact
    for cell in nb.cells:
        assert not any(PROGRESS.search(t) for t in _texts(cell.outputs)), cell.outputs
        live = [o for o in cell.outputs if o["output_type"] == "display_data"]
        assert live and all(o["data"] == {"text/plain": ""} for o in live)
        assert all(o["metadata"] == {progress.QUARTO_DISPLAY: False} for o in live)
    assert drop_undisplayed_outputs(nb) == len(CELLS)
    kept = [[t for t in _texts(c.outputs) if t] for c in nb.cells]
    assert kept[0] == ["kept\n"] and kept[1] == ["'probe result'"] and kept[2] == ["run finished\n"]
    assert [o["output_type"] for o in nb.cells[3].outputs] == ["error"]


def test_live_lines_show_the_latest_lines_and_empty_to_what_quarto_skips():
    calls = []

    class Handle:
        def update(self, data, **kw):
            calls.append(("update", data, kw["metadata"]))

    def display(data, **kw):
        calls.append(("display", data, kw["metadata"]))
        assert kw["display_id"] is True and kw["raw"] is True
        return Handle()

    lines = progress.LiveLines(display, keep=2)
    lines.clear()  # nothing said yet: no display made
    assert calls == []
    for text in ("a", "b", "c"):
        lines.say(text)
    assert calls[0] == ("display", {"text/plain": "a"}, {})
    assert calls[-1] == ("update", {"text/plain": "b\nc"}, {})
    lines.clear()
    assert calls[-1] == ("update", {"text/plain": ""}, {"quarto_display": False})


def test_outside_a_kernel_notes_print(capsys, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    progress.note("importing torch (seconds)")
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # a kernel module but no IPython shell: print too
    progress.live_say()("[dry run] x")
    assert capsys.readouterr().out.splitlines() == ["importing torch (seconds)", "[dry run] x"]
