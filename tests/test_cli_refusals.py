"""Issue 43: ``smolfsdp memory`` and ``smolfsdp dryrun`` refuse an argument they cannot honour in one line, before
torch loads (so before any estimate or dry run), naming the option and the fix; and a dry run's report does
not need ``data/results/published/check.json`` for its one line about it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from smolfsdp import cli_dryrun
from smolfsdp.audit import published_rows

#: Runs ``smolfsdp.cli.main(argv)`` and reports its exit status and whether torch was ever imported.
PROBE = """
import json, sys
from smolfsdp import cli
rc = cli.main(sys.argv[1:])
print(json.dumps({"rc": rc, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


def _refusal(args: list[str], tmp_path) -> str:
    """The one error line of ``smolfsdp ARGS`` (asserting exit 2, one line, torch never imported)."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    *said, probe = proc.stderr.strip().splitlines()
    assert json.loads(probe) == {"rc": 2, "torch": False}, proc.stderr
    assert len(said) == 1 and said[0].startswith("smolfsdp: error: "), proc.stderr
    assert proc.stdout == ""
    return said[0]


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["memory", "--gpu-memory-gib", "nan"], "nan"),
        (["memory", "--gpu-memory-gib", "inf"], "inf"),
        (["dryrun", "--gpu-memory-gib", "nan"], "nan"),
        (["dryrun", "--gpu-memory-gib", "0"], "0"),
        (["dryrun", "--gpu", "H100 SXM", "--gpu-memory-gib=-inf"], "-inf"),
    ],
    ids=["memory-nan", "memory-inf", "dryrun-nan", "dryrun-0", "dryrun-minus-inf"],
)
def test_gpu_memory_that_is_not_a_positive_finite_size_is_refused_first(args, shown, tmp_path):
    """nan and inf passed ``<= 0`` and failed after the whole dry run; ``dryrun --gpu-memory-gib 0`` was dropped."""
    line = _refusal(args, tmp_path)
    assert f"--gpu-memory-gib {shown}: give the GPU's memory as a positive, finite number of GiB" in line


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--lora-layout", "adapter-units"], "without --lora there are no adapters; add --lora"),
        (
            ["--lora", "--fsdp-version", "2", "--lora-layout", "adapter-units"],
            "an FSDP1 layout (FSDP2 shards each parameter as its own DTensor",
        ),
    ],
    ids=["no-lora", "fsdp2"],
)
def test_memory_lora_layout_it_would_ignore_is_refused(args, why, tmp_path):
    line = _refusal(["memory", *args], tmp_path)
    assert "--lora-layout adapter-units" in line and why in line


@pytest.mark.parametrize("model", ["../models/nope", "./nope", "~/smolfsdp-no-such-model", "a/b/c"])
def test_memory_model_that_looks_like_a_path_and_is_missing_is_a_missing_folder(model, tmp_path):
    """``../models/nope`` was looked up on the Hub ("Could not resolve ... offline ... huggingface-cli download")."""
    line = _refusal(["memory", "--model", model], tmp_path)
    assert f"--model {model}: no such folder" in line and "huggingface-cli" not in line
    assert "give a folder with the model's config.json, or a hub id owner/name" in line


def test_dryrun_report_says_so_when_the_published_check_file_is_absent_or_unreadable(monkeypatch, tmp_path):
    """The report's one line about published runs read check.json after the whole dry run and raised without it."""
    monkeypatch.setattr(published_rows, "CHECK_PATH", str(tmp_path / "check.json"))
    line = cli_dryrun._held_to_published()
    assert line == (
        f"not yet held to published runs: {tmp_path / 'check.json'} is absent "
        "(python scripts/published_check.py writes it)"
    )
    (tmp_path / "check.json").write_text('{"dry_run": [')
    line = cli_dryrun._held_to_published()
    assert line.startswith(f"not held to published runs: {tmp_path / 'check.json'} is not readable JSON (")
    monkeypatch.undo()  # the committed file: its six dry-run rows
    assert cli_dryrun._held_to_published().startswith("held to 6 published torchtitan runs within ")
