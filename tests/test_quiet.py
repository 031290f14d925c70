"""A newcomer's runs print no third-party warning lines (issue 17), and the filters drop nothing else.

``smolfsdp.quiet`` filters the known harmless ones; the rest are fixed at their cause. The end-to-end
test runs the demo (native FSDP1), a LoRA run (native FSDP2 + peft) and a TRL run (SFTTrainer + FSDP1)
for a few steps and counts the lines of their captured output that look like a warning and are not
smolfsdp's own.
"""

import json
import logging
import re
import stat
import warnings
from pathlib import Path

import pytest

from smolfsdp import quiet
from smolfsdp.config import load_config
from smolfsdp.data.files import load_rows
from smolfsdp.launch import runner
from smolfsdp.quiet import third_party_warning_lines  # one definition: rank0_progress drops the same lines
from smolfsdp.train.trl_callbacks import log_line

ROOT = Path(__file__).resolve().parents[1]


def test_counter_sees_the_warnings_issue_17_lists():
    """The counter flags each kind of line the issue lists (as the unfixed runs printed them)."""
    before = """\
/x/site-packages/transformers/modeling_utils.py:3312: FutureWarning: `is_gradient_checkpointing` is deprecated
  warnings.warn(
/x/site-packages/peft/utils/save_and_load.py:313: UserWarning: Could not find a config file in tiny - will assume
[transformers] FSDP1 (`fsdp_config['version'] = 1`) is deprecated and will be removed in Transformers v5.20.
[rank1] 09:11:40 accelerate.utils.dataclasses: sharding_strategy is deprecated in favor of reshard_after_forward.
[rank0] 09:10:08 smolfsdp.data.prepare: 20 of 180 rows were longer than max_length=256 and were truncated
[rank0] 09:11:40 smolfsdp.train.sft: note: transformers deprecates the Trainer's FSDP1 path"""
    assert len(third_party_warning_lines(before)) == 5


#: Rows of more than the bundled tokenizer's model_max_length (2,048) tokens but under the character bound
#: (max_length 256 x 32), so they are tokenized in full and dropped as too long (issue 27)
LONG_ROWS = 2


def long_row_file(path: Path) -> Path:
    """The first 58 bundled rows and :data:`LONG_ROWS` rows whose answer is 2,200 tokens ("7 " x 1,100)."""
    rows = load_rows("bundled").to_list()[:58]
    rows += [{"Question": f"Long question {i}?", "Response": "7 " * 1100} for i in range(LONG_ROWS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def quiet_runs(tmp_path_factory):
    """The demo, a LoRA and a TRL run as configured, 3 steps each on 60 rows, evaluation at step 0 and the end,
    output captured; and the README's LoRA + FSDP1 command (``smolfsdp train --lora --fsdp_version 1 ...``)
    on a file with rows too long for the tokenizer."""
    out = tmp_path_factory.mktemp("quiet")
    short = {"output_dir": str(out), "max_steps": 3, "eval_steps": 0, "max_rows": 60}
    runs = {}
    for name in ("smoke", "lora_smoke", "smoke_trl"):
        cfg = load_config(ROOT / "configs" / "runs" / f"{name}.yaml", **short)
        runs[name] = runner.run(cfg, capture=True, timeout=300)
    data = long_row_file(out / "long_rows.jsonl")
    cfg = load_config(lora=True, fsdp_version=1, name="lora_fsdp1", dataset=str(data), **short)
    runs["lora_fsdp1"] = runner.run(cfg, capture=True, timeout=300)
    return runs


@pytest.mark.parametrize("name", ["smoke", "lora_smoke", "smoke_trl", "lora_fsdp1"])
def test_runs_print_no_third_party_warnings(quiet_runs, name):
    run = quiet_runs[name]
    m = run.summary["metrics"]
    assert m["steps"] == 3
    assert third_party_warning_lines(run.log) == []
    # eval_steps 0 with eval_on_start (the default), on either engine: step 0 and after the last step
    assert (m["eval_step_first"], m["eval_step_last"]) == (0, 3)
    assert re.search(r"eval loss \d\.\d{3} \(step 0\) -> \d\.\d{3} \(step 3\) over 3 steps", run.log)
    # neither says "warn": torch's FSDP1 clip on a rank without LoRA gradients, transformers' long-row notice
    assert "clip_grad_norm_()" not in run.log and "Token indices sequence length" not in run.log


def test_long_rows_are_counted_once_with_the_reason(quiet_runs):
    run = quiet_runs["lora_fsdp1"]
    data = run.summary["data"]
    assert data["rows_in"] == 60 and data["dropped_too_long"] >= LONG_ROWS
    line = (
        f"data: {data['dropped_too_long']} rows dropped: too long: more than max_length=256 tokens as a chat, "
        "and an answer is never cut (too_long: drop); they never reach the model. Raise max_length to keep them"
    )
    assert run.log.count(line) == 1, run.log[:3000]  # rank 0 only


def test_long_row_tokenizes_without_the_indexing_errors_notice(caplog):
    """The notice transformers logs once per tokenizer (a fresh tokenizer here: the flag is per instance);
    transformers' loggers do not propagate to the root, so caplog's handler goes on theirs."""
    from smolfsdp.data.chat import build_messages, tokenize_messages
    from smolfsdp.models.modeling import load_tokenizer

    tok = load_tokenizer("tiny")
    hf = logging.getLogger("transformers")
    hf.addHandler(caplog.handler)
    try:
        out = tokenize_messages(build_messages("Q?", "7 " * 1100, ""), tok, 256)
        ours = [r.getMessage() for r in caplog.records]
        tok("7 " * 1100)  # the same text without verbose=False: the notice this test would see
    finally:
        hf.removeHandler(caplog.handler)
    assert out["truncated"] and len(out["input_ids"]) == 256
    assert ours == [], ours  # nothing while our tokenisation ran
    # the control: the plain call logs it (a record may reach caplog twice when transformers propagates)
    msgs = {r.getMessage() for r in caplog.records}
    assert len(msgs) == 1 and next(iter(msgs)).startswith("Token indices sequence length is longer"), msgs


def test_trl_run_logs_one_readable_line_per_step_on_rank0(quiet_runs):
    log = quiet_runs["smoke_trl"].log
    assert "{'loss'" not in log and "{'train_runtime'" not in log  # the Trainer's raw dicts are gone
    steps = re.findall(
        r"step (\d+)/3  loss \d+\.\d{4}  grad_norm [\d.]+  lr [\d.e+-]+  tokens seen [\d,]+", log
    )
    assert steps == ["1", "2", "3"]  # logging_steps 1: one line per step, rank 0 only
    # the FSDP1 deprecation said once, by smolfsdp, instead of transformers' line on each rank
    assert log.count("transformers deprecates the Trainer's FSDP1 path") == 1


def test_final_model_files_are_0644_like_the_rest(quiet_runs):
    """safetensors 0.8 writes through a 0600 temporary file; smolfsdp gives the model the umask's mode."""
    final = Path(quiet_runs["smoke"].summary["final_model"])
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in final.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o644, modes
    adapter = Path(quiet_runs["lora_smoke"].summary["adapter"]["adapter"])
    assert stat.S_IMODE((adapter / "adapter_model.safetensors").stat().st_mode) == 0o644


# ------------------------------------------------------------------------------ the filters
def test_filters_drop_only_the_known_messages(caplog):
    quiet.install()
    quiet.install()  # idempotent: one filter per logger
    acc = logging.getLogger("accelerate.utils.dataclasses")
    assert sum(isinstance(f, quiet._DropKnown) for f in acc.filters) == 1
    with caplog.at_level(logging.WARNING):
        acc.warning(
            "sharding_strategy is deprecated in favor of reshard_after_forward. "
            "This will be removed in a future version of Accelerate."
        )
        acc.warning("backward_prefetch is not supported in FSDP2. Setting backward prefetch to None.")
        logging.getLogger("transformers.training_args").warning(
            "FSDP1 (`fsdp_config['version'] = 1`) is deprecated and will be removed in Transformers v5.20."
        )
        logging.getLogger("transformers.training_args").warning("max_steps is given, it will override ...")
    assert [r.getMessage()[:17] for r in caplog.records] == ["backward_prefetch", "max_steps is give"]


def test_warning_filter_is_narrow():
    quiet.install()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        quiet.install()  # after simplefilter: the known filter goes first again
        warnings.warn_explicit(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.",
            FutureWarning,
            "modeling_utils.py",
            1,
            module="transformers.modeling_utils",
        )
        warnings.warn_explicit(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.",
            FutureWarning,
            "ours.py",
            1,
            module="smolfsdp.ours",  # the same text from another module still shows
        )
        warnings.warn_explicit(
            "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a "
            "single process.",
            UserWarning,
            "utils.py",
            485,
            module="torch.distributed.checkpoint.utils",
        )
        warnings.warn("our own truncation notice", UserWarning, stacklevel=1)
    assert [str(w.message)[:20] for w in seen] == ["`is_gradient_checkpo", "our own truncation n"]


def test_every_known_entry_says_where_and_why():
    for k in quiet.KNOWN:
        assert re.search(r"\d+\.\d+", k.library) and len(k.why) > 40
        assert quiet.is_known(re.sub(r"\\", "", k.message).rstrip("$"))


def test_log_line_values():
    logs = {
        "loss": 6.9341,
        "grad_norm": 2.3541,
        "learning_rate": 0.003,
        "epoch": 0.1,
        "num_input_tokens_seen": 3494,
    }
    assert (
        log_line(2, 4, logs)
        == "step 2/4  loss 6.9341  grad_norm 2.354  lr 3.00e-03  tokens seen 3,494  epoch 0.10"
    )
    assert log_line(4, 4, {"eval_loss": 6.5381, "epoch": 0.2}) == "step 4/4  eval_loss 6.5381"
    assert log_line(4, 4, {"train_runtime": 3.7, "train_loss": 6.8}) is None
