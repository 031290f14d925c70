"""Security: secrets never reach a file a run writes, our loads are weights_only, exports are safetensors,
trust_remote_code is off unless asked for."""

import ast
import os
from pathlib import Path

import pytest

from smolfsdp import launch, sft
from smolfsdp.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {
    "HF_TOKEN": "hf_secretAbCdEfGhIjKlMnOpQrStUvWx1234",
    "WANDB_API_KEY": "wandbkey0123456789abcdef0123456789abcdef",
    "MY_SERVICE_PASSWORD": "correct-horse-battery-staple-42",
}


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    """A real 2-rank smoke run (2 steps, a checkpoint, final model) with secrets in its environment, one
    also in the config's free-form notes."""
    out = tmp_path_factory.mktemp("runs")
    saved = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)
    try:
        cfg = TrainConfig(
            name="secret",
            output_dir=str(out),
            max_steps=2,
            save_steps=2,
            eval_steps=0,
            per_device_train_batch_size=2,
            max_length=64,
            extra={"note": f"pushed with {SECRETS['HF_TOKEN']}", "hub_token": SECRETS["HF_TOKEN"]},
        )
        run = sft.run(cfg, capture=True, timeout=600)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return run


def test_no_secret_in_any_file_a_run_wrote(secret_run):
    files = [p for p in secret_run.path.rglob("*") if p.is_file()]
    names = {p.relative_to(secret_run.path).as_posix() for p in files}
    assert {"config.yaml", "summary.json", "metrics.jsonl", "final_model/model.safetensors"} <= names
    assert any(n.startswith("checkpoints/step-000002/") and n.endswith(".distcp") for n in names)
    for path in files:
        data = path.read_bytes()  # binary too: shards, safetensors, RNG states
        for name, value in SECRETS.items():
            assert value.encode() not in data, f"{name}'s value is in {path}"
    # the ranks really had the secrets (they inherit the launcher's environment), and the notes were redacted
    assert secret_run.config["extra"] == {"note": "pushed with <redacted>", "hub_token": "<redacted>"}


def test_exported_models_are_safetensors_only(secret_run, tmp_path):
    from smolfsdp.checkpoint import convert_checkpoint

    weight_suffixes = {".bin", ".pt", ".pth", ".pkl", ".ckpt"}
    final = secret_run.path / "final_model"
    converted = convert_checkpoint(secret_run.path / "checkpoints" / "step-000002", tmp_path / "converted")
    for folder in (final, converted):
        files = {p.name for p in folder.iterdir()}
        assert "model.safetensors" in files
        assert not {f for f in files if Path(f).suffix in weight_suffixes}, files


def test_redact():
    env = {
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz",
        "TOKENIZERS_PARALLELISM": "false",
        "PATH": "/usr/bin:/bin",
    }
    secrets = launch.secret_values(env)
    assert secrets == ["hf_abcdefghijklmnopqrstuvwxyz"]
    record = {
        "tokens": 3072,
        "tokens_per_s": 1507.5,
        "pad_token": "<|pad|>",
        "hub_token": "abc",
        "aws_secret_access_key": "x" * 40,
        "cmd": "curl -H 'Authorization: Bearer hf_abcdefghijklmnopqrstuvwxyz' https://hf.co",
        "nested": [{"WANDB_API_KEY": "k" * 40}, "sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123"],
    }
    assert launch.redact(record, secrets) == {
        "tokens": 3072,
        "tokens_per_s": 1507.5,
        "pad_token": "<|pad|>",
        "hub_token": "<redacted>",
        "aws_secret_access_key": "<redacted>",
        "cmd": "curl -H 'Authorization: Bearer <redacted>' https://hf.co",
        "nested": [{"WANDB_API_KEY": "<redacted>"}, "<redacted>"],
    }


def test_trust_remote_code_is_off_by_default():
    assert TrainConfig().trust_remote_code is False
    recipes = sorted((ROOT / "configs" / "runs").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        assert "trust_remote_code: true" not in recipe.read_text().lower(), recipe


def _torch_load_calls(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("torch.load", "load")
            and any(isinstance(a, ast.Name) and a.id == "torch" for a in ast.walk(node.func))
        ):
            yield node


def test_our_loads_are_weights_only():
    calls = []
    for path in sorted((ROOT / "src" / "smolfsdp").glob("*.py")):
        for node in _torch_load_calls(path):
            kw = {k.arg: k.value for k in node.keywords}
            ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            calls.append((path.name, node.lineno, ok))
    assert calls, "expected at least checkpoint.restore_rng's torch.load"
    assert all(ok for *_, ok in calls), [c for c in calls if not c[2]]
