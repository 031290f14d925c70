"""Issue 34: a model folder's own Python (``auto_map``) never runs without ``--trust_remote_code true``,
through every command that reads a model folder; bad ``dryrun`` sizes are refused before any work."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.params import resolve_model_config
from smolfsdp.models.modeling import build_meta_model, build_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data/models/smollm3_3b/config.json"


@pytest.fixture
def evil_folder(tmp_path):
    """A model folder whose config and tokenizer name ``evil.py``; importing it writes ``marker``."""
    folder = tmp_path / "evil_model"
    folder.mkdir()
    marker = tmp_path / "marker"
    config = json.loads(SHIPPED.read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["evil.Tok", None]}})
    )
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder, marker


def _cli(args, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "smolfsdp.cli", *args], input="y\ny\n", capture_output=True, text=True,
        env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip


def _fake_checkpoint(tmp_path) -> Path:
    """A checkpoint as ``convert``'s checks see it (metadata file, marker, the run's config.yaml)."""
    from smolfsdp.checkpoint.verify import MARKER
    from smolfsdp.config import TrainConfig

    ckpt = tmp_path / "runs" / "r" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_bytes(b"")
    (ckpt / MARKER).write_text("")
    TrainConfig(name="r", output_dir=str(tmp_path / "runs")).save(ckpt.parent.parent / "config.yaml")
    return ckpt


#: The advice each command gives: the option it really has (issue 43: memory has none; convert's is a flag).
ADVICE = {
    "memory": "smolfsdp memory has no such option: it never runs a model's own code",
    "dryrun": "pass --trust_remote_code true only after reading that code",
    "convert": "pass --trust_remote_code only after reading that code",
}


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "--model", "{m}"],
        ["dryrun", "--model", "{m}", "--gpus", "2"],
        ["dryrun", "--model", "{m}", "--trust_remote_code", "false"],
        ["convert", "{ckpt}", "{out}", "--model", "{m}"],
    ],
    ids=["memory", "dryrun", "dryrun-trust-false", "convert"],
)
def test_cli_never_runs_a_folders_code(evil_folder, tmp_path, args):
    folder, marker = evil_folder
    places = {"m": folder, "ckpt": _fake_checkpoint(tmp_path), "out": tmp_path / "out"}
    proc = _cli([a.format(**places) for a in args], tmp_path)
    assert not marker.exists()
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("smolfsdp: error: ") and "auto_map" in lines[-1], proc.stderr
    assert ADVICE[args[0]] in lines[-1]
    if args[0] != "dryrun":
        assert "--trust_remote_code true" not in lines[-1]
    assert "Traceback" not in proc.stderr and "[y/N]" not in proc.stdout + proc.stderr


def test_every_loader_refuses_a_folders_code(evil_folder):
    """train (runner, both engines), convert and LoRA read the folder through these three; the dry run
    and the estimator through resolve_model_config."""
    folder, marker = evil_folder
    for load in (
        lambda: resolve_model_config(str(folder)),
        lambda: load_tokenizer(str(folder)),
        lambda: load_tokenizer("tiny", tokenizer=str(folder)),
        lambda: build_meta_model(str(folder)),
        lambda: build_model(str(folder), None),
    ):
        with pytest.raises(ConfigError, match="auto_map.*--trust_remote_code true"):
            load()
    assert not marker.exists()


def test_dryrun_gpus_below_one_is_one_line_before_torch(tmp_path):
    for n in ("0", "-1"):
        proc = _cli(["dryrun", "--gpus", n], tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            f"smolfsdp: error: --gpus {n}: the fake group needs at least 1 rank; give --gpus 1 or more."
        ]


def test_a_million_layers_is_refused_before_building(tmp_path):
    folder = tmp_path / "huge"
    folder.mkdir()
    config = json.loads(SHIPPED.read_text()) | {"num_hidden_layers": 10**6}
    for per_layer in ("layer_types", "no_rope_layers"):  # lists of 36: transformers would refuse the mismatch
        config.pop(per_layer, None)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="num_hidden_layers=1,000,000 .* outside 1..2,048"):
        resolve_model_config(str(folder))
    proc = _cli(["dryrun", "--model", str(folder)], tmp_path)
    assert proc.returncode == 2 and "num_hidden_layers=1,000,000" in proc.stderr.splitlines()[-1]
    assert "MemoryError" not in proc.stderr
