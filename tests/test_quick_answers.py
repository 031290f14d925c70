"""Commands answer at once and say what they do: ``gotchas --list`` without torch (the catalogue in
``smolfsdp.gotchas.registry``), and ``bench`` printing its first line before any work and each stage
(the checks with their row counts, the launch) before the ranks start."""

from __future__ import annotations

import json
import subprocess
import sys

from smolfsdp import cli
from smolfsdp.gotchas import run_all as gotchas
from smolfsdp.launch import runner, torchrun

LIST_PROBE = """
import json, sys, time
t0 = time.perf_counter()
from smolfsdp import cli
rc = cli.main(["gotchas", "--list", "--json"])
heavy = sorted(m for m in ("torch", "peft", "transformers", "pandas") if m in sys.modules)
print(json.dumps({"rc": rc, "heavy": heavy, "s": time.perf_counter() - t0}), file=sys.stderr)
"""


def test_gotchas_list_answers_without_torch():
    proc = subprocess.run([sys.executable, "-c", LIST_PROBE], capture_output=True, text=True, timeout=120)
    probe = json.loads(proc.stderr.strip().splitlines()[-1])
    assert probe["rc"] == 0 and probe["heavy"] == []  # torch alone took 26-38 s on a busy 2-core box
    listed = json.loads(proc.stdout)
    # the same gotchas, in the chapter's order, as the run path registers (their cases attached)
    assert [g["name"] for g in listed] == list(gotchas.GOTCHAS)
    assert [g["title"] for g in listed] == [g.title for g in gotchas.GOTCHAS.values()]
    assert all(g.fn is not None for g in gotchas.GOTCHAS.values())


def test_bench_says_what_it_does_before_the_launch(monkeypatch, tmp_path, capsys):
    """The real checks run (tokenising the bundled rows, the meta model); only the launch is replaced."""
    seen = []

    def fake_launch(cfg):
        seen.append(cfg.name)
        print("LAUNCHED")
        return subprocess.CompletedProcess([], 3)  # a failed run: bench stops there, with its code

    real = runner.preflight
    monkeypatch.setattr(
        runner, "preflight", lambda cfg, progress=None: seen.append(real(cfg, progress)) or {}
    )
    monkeypatch.setattr(torchrun, "launch", fake_launch)
    assert cli.main(["bench", "--output_dir", str(tmp_path)]) == 3
    lines = capsys.readouterr().out.splitlines()
    data = seen[0]["data"]
    assert lines == [
        "[smolfsdp] bench bench: 5 steps (1 warm-up) on 2 processes, profiled; loading torch and checking "
        "the configuration",
        "[smolfsdp] checking the data: loading the tokenizer of tiny and tokenising bundled",
        f"[smolfsdp] data: {data['kept']:,} of {data['rows_in']:,} rows kept, {data['train_rows']:,} train / "
        f"{data['eval_rows']:,} eval; checking the model's shapes (meta device, no weights)",
        "[smolfsdp] launching 2 processes (torchrun); each loads and shards the model, rank 0 reports from there",
        "LAUNCHED",
    ]
    assert data["rows_in"] == 180 and seen[1] == "bench"
