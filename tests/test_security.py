"""Security: secrets never reach a file a run writes, our loads are weights_only, a planted checkpoint runs
nothing, exports are safetensors, trust_remote_code is off unless asked for."""

import ast
import hashlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml

from smolfsdp.checkpoint import dcp as checkpoint
from smolfsdp.cli import main as cli_main
from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch import failures, runner
from smolfsdp.paths import bundled_data_path
from smolfsdp.secrets import is_secret_name, redact, secret_values

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {
    "HF_TOKEN": "hf_secretAbCdEfGhIjKlMnOpQrStUvWx1234",
    "WANDB_API_KEY": "wandbkey0123456789abcdef0123456789abcdef",
    "MY_SERVICE_PASSWORD": "correct-horse-battery-staple-42",
}


#: "hf_" + 26 letters/digits: matches smolfsdp.secrets.SECRET_VALUE, as a real dataset name did
TOKEN_SHAPED_FILE = "hf_medicalquestionanswers2024.jsonl"


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    """A real 2-rank smoke run (2 steps, a checkpoint, final model) with secrets in its environment, one
    also in the config's free-form notes, and a dataset file whose name contains a token-shaped substring
    (the bundled rows, copied to ``hf_medicalquestionanswers2024.jsonl``)."""
    out = tmp_path_factory.mktemp("runs")
    dataset = tmp_path_factory.mktemp("data") / TOKEN_SHAPED_FILE
    shutil.copyfile(bundled_data_path(), dataset)
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
            too_long="truncate",
            dataset=str(dataset),
            extra={"note": f"pushed with {SECRETS['HF_TOKEN']}", "hub_token": SECRETS["HF_TOKEN"]},
        )
        run = runner.run(cfg, capture=True, timeout=600)
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


def test_ranks_train_with_the_unredacted_config_files_show_it_redacted(secret_run):
    """The ranks read the dataset at its real path (redaction used to hand them '<redacted>.jsonl', which
    does not exist); the config.yaml files written for people show the path redacted."""
    assert secret_run.train["step"].tolist() == [1, 2]
    assert (secret_run.train["tokens"] > 0).all()
    for path in (secret_run.path, secret_run.path / "checkpoints" / "step-000002"):
        written = yaml.safe_load((path / "config.yaml").read_text())
        assert written["dataset"].endswith("/<redacted>.jsonl"), path
        assert TOKEN_SHAPED_FILE not in (path / "config.yaml").read_text()


def test_save_redacts_unless_told_not_to(tmp_path):
    cfg = TrainConfig(dataset=f"/data/{TOKEN_SHAPED_FILE}", extra={"hub_token": "abc", "flops_per_token": 6})
    cfg.save(tmp_path / "people.yaml")  # the default: for files people read
    cfg.save(tmp_path / "ranks.yaml", redact_secrets=False)  # what launch() hands the ranks
    people = yaml.safe_load((tmp_path / "people.yaml").read_text())
    ranks = yaml.safe_load((tmp_path / "ranks.yaml").read_text())
    assert people["dataset"] == "/data/<redacted>.jsonl"
    assert people["extra"] == {"hub_token": "<redacted>", "flops_per_token": 6}
    assert ranks == cfg.to_dict()
    assert TrainConfig(**ranks) == cfg


def test_exported_models_are_safetensors_only(secret_run, tmp_path):
    from smolfsdp.checkpoint.dcp import convert_checkpoint

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
    secrets = secret_values(env)
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
    assert redact(record, secrets) == {
        "tokens": 3072,
        "tokens_per_s": 1507.5,
        "pad_token": "<|pad|>",
        "hub_token": "<redacted>",
        "aws_secret_access_key": "<redacted>",
        "cmd": "curl -H 'Authorization: Bearer <redacted>' https://hf.co",
        "nested": [{"WANDB_API_KEY": "<redacted>"}, "<redacted>"],
    }


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "hub_token",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "access_token",
        "auth_token",
        "api_token",
        "TOKEN",
        "AWS_SESSION_TOKEN",
        "MY_SERVICE_TOKEN",
        "WANDB_API_KEY",
        "MY_SECRET",
        "client_secret_id",
        "DB_PASSWORD",
        "password",
        "AWS_SECRET_ACCESS_KEY",
        "password_end_token",  # the TOKEN exceptions never excuse a PASSWORD
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)
    assert redact({name: "v"}, []) == {name: "<redacted>"}


@pytest.mark.parametrize(
    "name",
    [
        "flops_per_token",
        "cost_per_token",
        "time_to_first_token",
        "num_tokens",
        "tokens",
        "tokens_per_s",
        "max_new_tokens",
        "pad_token",
        "eos_token",
        "bos_token",
        "unk_token",
        "mask_token",
        "chat_template_token",
        "TOKENIZERS_PARALLELISM",
        "tokenizer",
    ],
)
def test_harmless_names_are_kept(name):
    assert not is_secret_name(name)
    assert redact({name: 1}, []) == {name: 1}


def test_redact_keeps_rates_and_template_tokens():
    # the newcomer's two cases; bench metrics.jsonl showed "flops_per_token": "<redacted>"
    assert redact({"cost_per_token": 1, "chat_template_token": "y"}, []) == {
        "cost_per_token": 1,
        "chat_template_token": "y",
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
    for path in sorted((ROOT / "src" / "smolfsdp").rglob("*.py")):  # every subpackage, not the top only
        for node in _torch_load_calls(path):
            kw = {k.arg: k.value for k in node.keywords}
            ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            calls.append((path.name, node.lineno, ok))
    assert calls, "expected at least checkpoint.restore_rng's torch.load"
    assert all(ok for *_, ok in calls), [c for c in calls if not c[2]]


def test_dcp_loads_go_through_the_allow_list():
    """Every DCP read in src/ uses checkpoint_verify's reader (no bare dcp.load or FileSystemReader)."""
    found = []
    for path in sorted((ROOT / "src" / "smolfsdp").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
                "load",
                "FileSystemReader",
                "read_metadata",
            ):
                name = ast.unparse(node.func)
                if name.startswith("dcp.") or "FileSystemReader" in name or "read_metadata" in name:
                    found.append((path.name, node.lineno, name))
    # the one dcp.load left is checkpoint.verify.dcp_load's, which passes the allow-list reader and planner
    assert [(f, n) for f, _, n in found] == [("verify.py", "dcp.load")], found


# ------------------------------------------------------------------ planted checkpoints (issue 16)
class _Payload:
    """Unpickling this runs ``os.system(command)``: what a planted checkpoint does when read."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _forge_marker(ckpt: Path, name: str) -> None:
    """Rewrite the COMPLETE marker's record of ``name`` as whoever planted the file would."""
    marker = json.loads((ckpt / "COMPLETE").read_text())
    data = (ckpt / name).read_bytes()
    marker["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "COMPLETE").write_text(json.dumps(marker))


@pytest.fixture
def planted(secret_run, tmp_path):
    """A copy of the secret run whose step-2 ``.metadata`` is real DCP metadata with a payload inside
    (``planner_data``) that creates ``pwned`` when unpickled; the marker is forged to match."""
    shutil.copytree(secret_run.path, tmp_path / "runs" / "secret")
    ckpt = tmp_path / "runs" / "secret" / "checkpoints" / "step-000002"
    flag = tmp_path / "pwned"
    meta = checkpoint.read_dcp_metadata(ckpt)
    meta.planner_data = _Payload(f"touch {flag}")
    with (ckpt / ".metadata").open("wb") as f:
        pickle.dump(meta, f)
    _forge_marker(ckpt, ".metadata")
    # the payload is live: torch's own reader runs it (this is what a resume or convert used to do)
    dcp.FileSystemReader(str(ckpt)).read_metadata()
    assert flag.exists()
    flag.unlink()
    return ckpt, flag


def test_planted_metadata_runs_nothing_through_any_entry_point(planted, tmp_path, capsys):
    from smolfsdp.models.modeling import build_model, load_tokenizer

    ckpt, flag = planted
    why = f"{ckpt / '.metadata'} asks to load posix.system, which DCP checkpoint metadata never holds"
    cfg = TrainConfig(
        name="secret", output_dir=str(ckpt.parent.parent.parent), max_steps=2, resume_from="latest"
    )
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="asks to load posix.system") as err:
        runner.preflight(cfg)  # --resume_from, before launch
    assert why in str(err.value)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="asks to load posix.system"):
        checkpoint.convert_checkpoint(ckpt, tmp_path / "out")
    assert cli_main(["convert", str(ckpt), str(tmp_path / "out")]) == 2
    assert why in capsys.readouterr().err
    model = build_model("tiny", load_tokenizer("tiny"), seed=0)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="asks to load posix.system"):
        checkpoint.load_checkpoint(ckpt, model, opt, sched)  # what the ranks call
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="asks to load posix.system"):
        checkpoint.check_matches_model(ckpt, model)
    line = failures.explain_failure("", 1, cfg)  # the failure line never recommends it
    assert "no checkpoint of this run verifies" in line and "posix.system" in line
    (ckpt / "COMPLETE").write_text("ok\n")  # a marker from before checksums: the allow-list still holds
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="asks to load posix.system"):
        checkpoint.resolve_resume("latest", ckpt.parent.parent, hashes=True)
    assert not flag.exists()
    assert not (tmp_path / "out").exists()


def test_a_poisoned_rng_file_is_refused_and_never_recommended(secret_run, tmp_path):
    """rng_rank0.pt replaced by a pickle that runs a command, the marker forged: the resume is refused before
    launch naming the file, and the failure line of the run offers no checkpoint to resume from."""
    shutil.copytree(secret_run.path, tmp_path / "runs" / "secret")
    ckpt = tmp_path / "runs" / "secret" / "checkpoints" / "step-000002"
    flag = tmp_path / "pwned"
    torch.save({"cpu": _Payload(f"touch {flag}"), "cuda": None}, ckpt / "rng_rank0.pt")
    _forge_marker(ckpt, "rng_rank0.pt")
    cfg = TrainConfig(name="secret", output_dir=str(tmp_path / "runs"), max_steps=4, resume_from="latest")
    with pytest.raises(checkpoint.UnsafeCheckpointError) as err:
        checkpoint.resolve_resume("latest", cfg.run_dir)  # what the ranks and the pre-launch check call
    assert f"{ckpt / 'rng_rank0.pt'} is not plain RNG state (UnpicklingError" in str(err.value)
    line = failures.explain_failure("", 1, cfg)
    assert "no checkpoint of this run verifies" in line and "rng_rank0.pt is not plain RNG state" in line
    assert "resume with" not in line
    assert not flag.exists()


def test_non_tensor_entries_are_read_weights_only(tmp_path):
    """DCP reads non-tensor entries (an optimizer's lr, betas) with torch.load(weights_only=False);
    checkpoint.dcp_load first proves they are plain data."""
    ckpt, flag = tmp_path / "ckpt", tmp_path / "pwned"
    dcp.save({"lr": 0.5, "w": torch.ones(3)}, checkpoint_id=str(ckpt), no_dist=True)
    state = {"lr": 0.0, "w": torch.zeros(3)}
    checkpoint.dcp_load(state, ckpt)
    assert state["lr"] == 0.5 and state["w"].tolist() == [1.0, 1.0, 1.0]
    meta = checkpoint.read_dcp_metadata(ckpt)
    info = next(v for k, v in meta.storage_data.items() if k.fqn == "lr")
    buf = io.BytesIO()
    torch.save(_Payload(f"touch {flag}"), buf)
    shard = ckpt / info.relative_path
    info.offset, info.length = shard.stat().st_size, len(buf.getvalue())
    with shard.open("ab") as f:
        f.write(buf.getvalue())
    with (ckpt / ".metadata").open("wb") as f:
        pickle.dump(meta, f)  # only allowed classes: the metadata itself passes the allow-list
    dcp.load({"lr": 0.0, "w": torch.zeros(3)}, checkpoint_id=str(ckpt), no_dist=True)
    assert flag.exists()  # the payload is live: torch's own load runs it
    flag.unlink()
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="the entry 'lr' is not plain data"):
        checkpoint.dcp_load({"lr": 0.0, "w": torch.zeros(3)}, ckpt)
    assert not flag.exists()


# ------------------------------------------------------------------ a checkpoint handed in is data (issue 27)
def _hostile_copy(secret_run, tmp_path):
    """A copy of the secret run whose step-2 ``config.yaml`` names a model folder inside the checkpoint with
    ``trust_remote_code: true``; that folder's ``config.json`` maps the Auto classes to ``evil.py``, which
    creates ``pwned`` when imported. The marker is forged to match, as whoever edited the folder would."""
    shutil.copytree(secret_run.path, tmp_path / "runs" / "secret")
    ckpt = tmp_path / "runs" / "secret" / "checkpoints" / "step-000002"
    flag, evil = tmp_path / "pwned", ckpt / "evil_model"
    evil.mkdir()
    (evil / "evil.py").write_text(f"import pathlib\npathlib.Path({str(flag)!r}).touch()\n")
    auto = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (evil / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto}))
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    saved.update(model=str(evil), trust_remote_code=True)
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved))
    _forge_marker(ckpt, "config.yaml")
    return ckpt, flag


def test_a_checkpoint_asking_for_remote_code_runs_none_on_convert_or_resume(secret_run, tmp_path, capsys):
    ckpt, flag = _hostile_copy(secret_run, tmp_path)
    out = tmp_path / "out"
    assert cli_main(["convert", str(ckpt), str(out)]) == 2
    err = capsys.readouterr()
    assert err.out == ""  # nothing said before the refusal
    assert f"names the model '{ckpt / 'evil_model'}' (a folder inside the checkpoint)" in err.err
    assert "Pass --model NAME" in err.err and len(err.err.strip().splitlines()) == 1
    # resume: the running config decides the model; the checkpoint's differing model is refused, not loaded
    cfg = TrainConfig(name="secret", output_dir=str(tmp_path / "runs"), max_steps=4, resume_from=str(ckpt))
    with pytest.raises(ConfigError, match=r"model '.*evil_model' -> 'tiny'"):
        runner.preflight(cfg)
    # told which model, convert rebuilds it without remote code and the export carries no code
    assert cli_main(["convert", str(ckpt), str(out), "--model", "tiny", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["model"] == "tiny" and "model.safetensors" in written["files"]
    assert not [f for f in written["files"] if f.endswith(".py")]
    assert json.loads((out / "smolfsdp_convert.json").read_text())["model"] == "tiny"
    assert not flag.exists()


def test_an_export_drops_code_files(tmp_path):
    from smolfsdp.checkpoint.convert import drop_code_files

    (tmp_path / "sub").mkdir()
    for name in ("modeling_evil.py", "sub/configuration_evil.py", "model.safetensors", "config.json"):
        (tmp_path / name).write_text("x")
    assert drop_code_files(tmp_path) == ["modeling_evil.py", "sub/configuration_evil.py"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "config.json",
        "model.safetensors",
    ]


def test_convert_never_writes_into_a_checkpoint_or_deletes_what_no_run_wrote(secret_run, tmp_path, capsys):
    run = tmp_path / "runs" / "secret"
    shutil.copytree(secret_run.path, run)
    ckpt = run / "checkpoints" / "step-000002"
    before = sorted(p.name for p in ckpt.iterdir())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    cases = {
        str(ckpt): "is the checkpoint",
        str(ckpt / "x"): "is inside the checkpoint",
        str(run): "holds the checkpoint",
        str(run / "checkpoints"): "holds the checkpoint",
        str(run / "checkpoints" / "exported"): "a checkpoint or a run's checkpoints/ folder",
        str(mine): "holds files smolfsdp convert did not write (notes.txt)",
    }
    for out, why in cases.items():
        assert cli_main(["convert", str(ckpt), out, "--overwrite"]) == 2, out
        got = capsys.readouterr()
        assert why in got.err and got.out == "" and len(got.err.strip().splitlines()) == 1, (out, got.err)
    assert sorted(p.name for p in ckpt.iterdir()) == before and (mine / "notes.txt").read_text() == "mine"
    assert not (run / "checkpoints" / "exported").exists()
    # a missing checkpoint: the error first, with the run's checkpoints that verify
    assert cli_main(["convert", str(run / "checkpoints" / "step-000009"), str(tmp_path / "o")]) == 2
    got = capsys.readouterr()
    assert got.out == "" and "step-000009 does not exist" in got.err
    assert f"Complete checkpoints in {run / 'checkpoints'} that verify (file sizes): {ckpt}." in got.err
    # an earlier convert's output may be replaced with --overwrite; once someone adds a file, it may not
    out = tmp_path / "exported"
    checkpoint.convert_checkpoint(ckpt, out)
    checkpoint.convert_checkpoint(ckpt, out, overwrite=True)
    (out / "README.md").write_text("my notes")
    with pytest.raises(ConfigError, match=r"did not write \(README.md\)"):
        checkpoint.convert_checkpoint(ckpt, out, overwrite=True)
    assert (out / "README.md").read_text() == "my notes"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary folder left


# ------------------------------------------------------------------ hostile inputs refused in one line (issue 27)
LOOP_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
ESCAPE_TEMPLATE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


def test_chat_templates_render_once_in_the_sandbox_within_a_time_bound(tmp_path):
    import time

    from smolfsdp.data.chat import check_chat_template
    from smolfsdp.models.modeling import load_tokenizer
    from smolfsdp.paths import bundled_tokenizer_path

    tok = load_tokenizer("tiny")
    check_chat_template(tok)  # the bundled template renders
    tok.chat_template = LOOP_TEMPLATE  # 10^10 iterations: hours
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"did not render a two-turn conversation within 0.5 s"):
        check_chat_template(tok, time_limit_s=0.5)
    assert time.perf_counter() - t0 < 3
    # a tokenizer folder whose template tries to leave Jinja's sandbox: refused before any row, one line
    folder = tmp_path / "tok"
    shutil.copytree(bundled_tokenizer_path(), folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = ESCAPE_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as err:
        runner.preflight(
            TrainConfig(name="hostile", output_dir=str(tmp_path / "runs"), tokenizer=str(folder))
        )
    msg = str(err.value)
    assert (
        f"The chat template of '{folder}' (tokenizer_config.json or chat_template.jinja) failed to render"
        in msg
    )
    assert "SecurityError" in msg and "\n" not in msg
    assert not (tmp_path / "runs" / "hostile").exists()


ALIAS_BOMB = "name: smoke\nextra:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)  # 9^9 = 387 million strings from ~600 bytes


def test_alias_bombs_tags_and_long_names_are_refused_in_one_line(tmp_path, capsys):
    import time
    import tracemalloc

    from smolfsdp.config import load_config

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 700
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb.yaml, line 4: not a plain YAML recipe \(an alias"):
        load_config(bomb)
    took, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert took < 1 and peak < 5 * 2**20, (took, peak)
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text(f"name: !!python/object/apply:os.system ['touch {tmp_path / 'pwned'}']\n")
    for path, why in ((bomb, "write the value out"), (tagged, "remove the tag: a recipe holds plain values")):
        assert cli_main(["train", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1 and str(path) in err
    assert not (tmp_path / "pwned").exists()
    assert cli_main(["train", "--name", "x" * 300]) == 2
    err = capsys.readouterr().err
    assert "is 300 characters; a run name is a folder name of at most 100" in err
    assert cli_main(["train", "--name", "my run"]) == 2
    assert "name='my run' holds ' '; a run name uses letters, digits" in capsys.readouterr().err


def _rewrite_header(path: Path, edit) -> None:
    """Rewrite a .safetensors file with ``edit(header)`` applied to its JSON header (data bytes unchanged)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    path.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n :])


def test_a_model_folder_whose_safetensors_header_lies_is_refused_before_launch(tmp_path):
    from smolfsdp.models.modeling import (
        build_meta_model,
        build_model,
        check_safetensors_folder,
        load_tokenizer,
    )

    folder = tmp_path / "model"
    tok = load_tokenizer("tiny")
    build_model("tiny", tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    cfg = TrainConfig(name="lying", output_dir=str(tmp_path / "runs"), model=str(folder))
    name = "model.layers.0.mlp.down_proj.weight"  # [128, 352] in the tiny config

    def transpose(h):
        h[name]["shape"] = h[name]["shape"][::-1]  # same bytes, another shape

    def beyond(h):
        start, end = h[name]["data_offsets"]
        h[name]["data_offsets"] = [start + 10**9, end + 10**9]

    cases = (
        (
            transpose,
            f"{weights}: {name!r} has shape [352, 128] but {folder / 'config.json'} builds [128, 352]",
        ),
        (beyond, f"{weights}: {name!r} (F32 [128, 352]) needs 180,224 bytes but its header points at bytes"),
    )
    for i, (edit, why) in enumerate(cases):
        weights.write_bytes(good)
        _rewrite_header(weights, edit)
        with pytest.raises(ConfigError) as err:
            if i == 0:  # what the launcher runs, before any process starts
                runner.preflight(cfg)
            else:
                check_safetensors_folder(str(folder), build_meta_model(str(folder)))
        assert why in str(err.value) and "\n" not in str(err.value)
    weights.write_bytes(good)
    check_safetensors_folder(str(folder), build_meta_model(str(folder)))  # the saved folder passes
    assert not (tmp_path / "runs" / "lying").exists()


@pytest.mark.parametrize("chapter", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_an_unknown_profile_stops_every_chapter_right_after_its_parameters(chapter):
    """papermill's ``-p PROFILE bogus`` gave chapter 01 a KeyError and ran chapter 07 silently. papermill and
    Quarto put the injected value right after the parameters cell; the cell after that checks it."""
    cells = json.loads((ROOT / "notebooks" / chapter).read_text())["cells"]
    params = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
    check = "".join(cells[params + 1]["source"])
    assert "check_profile(PROFILE)" in check and cells[params + 1]["metadata"]["tags"] == ["remove-cell"]
    namespace: dict = {}
    exec("".join(cells[params]["source"]), namespace)
    exec(check, namespace)  # the default passes
    exec('PROFILE = "bogus"', namespace)  # what `papermill -p PROFILE bogus` injects
    with pytest.raises(ConfigError) as err:
        exec(check, namespace)
    assert str(err.value).startswith(
        "PROFILE='bogus' is not a profile of this book: use smoke (CPU, minutes)"
    )
