"""Human output by default, ``--json`` for machines (issue 17): bench, gotchas --list, convert, stop early."""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, SHARED
from test_trace_analysis import _fsdp2_gpu_trace, _write

from smolfsdp import cli, cli_output
from smolfsdp.checkpoint.dcp import MARKER
from smolfsdp.config import GROUPS, TrainConfig
from smolfsdp.estimate.hardware import GPUS, fit_verdict
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.recommend import recommend
from smolfsdp.gotchas.run_all import GOTCHAS, KIND_LEGEND
from smolfsdp.launch import runner
from smolfsdp.measure import benchmark
from smolfsdp.paths import umask_modes
from smolfsdp.train import sft

CPU_BENCH = {
    "name": "bench",
    "engine": "native",
    "strategy": "fsdp1",
    "world_size": 2,
    "device": "cpu",
    "device_name": None,
    "warmup_steps": 1,
    "mfu_reason": "CPU run: smolfsdp.estimate.hardware has no peak FLOP/s for CPUs, so MFU is not defined",
    "summary": {
        "timed_steps": 4,
        "step_time_ms_median": 1276.2641180001992,
        "step_time_ms_min": 808.4060059995863,
        "step_time_ms_max": 1315.1982839998709,
        "tokens_per_step_mean": 1772.25,
        "tokens_per_s_median": 2055.399603748688,
        "samples_per_s_median": 9.07,
        "tflops_median": 0.00694517464524635,
        "mfu_median": None,
    },
    "memory_per_rank": [
        {"rss_bytes": 621187072, "rss_peak_bytes": 631187072, "tensor_bytes": 6956116},
        {"rss_bytes": 618270720, "rss_peak_bytes": 628074112, "tensor_bytes": 6956120},
    ],
}


def test_bench_table_has_units_and_says_why_no_mfu():
    rows = dict(line.split("  ", 1) for line in cli_output.format_bench(CPU_BENCH).splitlines())
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["strategy that ran"] == "fsdp1 (native engine, 2 ranks, cpu)"
    assert rows["step time, median"] == "1,276.3 ms (min 808.4, max 1,315.2)"
    assert rows["tokens/s, all ranks"] == "2,055 (1,772 tokens/step)"
    assert rows["TFLOP/s per rank"] == "0.006945"
    assert (
        rows["MFU"]
        == "- (CPU run: smolfsdp.estimate.hardware has no peak FLOP/s for CPUs, so MFU is not defined)"
    )
    assert rows["memory, rank 0"].startswith("601.9 MiB process RSS peak, 6.6 MiB in parameters")


def test_bench_table_gpu_memory_in_gib_and_mfu_percent():
    gpu = {
        **CPU_BENCH,
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "summary": {**CPU_BENCH["summary"], "mfu_median": 0.4123},
        "memory_per_rank": [
            {
                **CPU_BENCH["memory_per_rank"][0],
                "max_memory_allocated_bytes": 40 * 2**30,
                "max_memory_reserved_bytes": int(41.5 * 2**30),
            },
        ],
    }
    table = cli_output.format_bench(gpu)
    assert "MFU                  41.2 %" in table and "NVIDIA H200" in table
    assert "40.00 GiB allocated, 41.50 GiB reserved (GPU peak in the step)" in table


def test_bench_json_flag(monkeypatch, capsys):
    from smolfsdp.launch import torchrun

    monkeypatch.setattr(runner, "preflight", lambda cfg, progress=None: {})
    monkeypatch.setattr(torchrun, "launch", lambda cfg, **kw: subprocess.CompletedProcess([], 0))
    monkeypatch.setattr(benchmark, "load_bench", lambda run_dir: CPU_BENCH | {"traces": []})
    assert cli.main(["bench", "--json", "--output_dir", "/tmp/unused"]) == 0
    out = json.loads(capsys.readouterr().out)  # the status lines went to stderr
    assert out["summary"]["step_time_ms_median"] == CPU_BENCH["summary"]["step_time_ms_median"]
    assert out["strategy"] == "fsdp1" and out["mfu_reason"].startswith("CPU run")
    assert cli.main(["bench", "--output_dir", "/tmp/unused"]) == 0
    assert "1,276.3 ms" in capsys.readouterr().out


def test_rss_peak_and_rss_from_one_source():
    """bench.json had rank 0's rss_peak_bytes below its rss_bytes (psutil vs getrusage)."""
    keep = torch.ones(32 * 2**20 // 4)  # 32 MiB touched: RSS moves between reads
    for _ in range(50):
        m = benchmark.process_rss()
        assert m["rss_peak_bytes"] >= m["rss_bytes"] > 32 * 2**20
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    assert abs(m["rss_bytes"] - int(status["VmRSS"].split()[0]) * 1024) < 64 * 2**20
    del keep


def test_step_meter_memory_uses_one_source(monkeypatch):
    monkeypatch.setattr(benchmark, "process_rss", lambda: {"rss_bytes": 10, "rss_peak_bytes": 12})
    meter = benchmark.StepMeter.__new__(benchmark.StepMeter)
    meter.info = type("I", (), {"device": torch.device("cpu")})()
    meter._tensor_bytes = 7
    assert meter.memory() == {"rss_bytes": 10, "rss_peak_bytes": 12, "tensor_bytes": 7}


def test_gotchas_list_explains_its_columns_and_json(capsys):
    assert cli.main(["gotchas", "--list"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["name", "how", "title"]
    for kind, meaning in KIND_LEGEND.items():
        assert f"  {kind:<6} {meaning}" in text
    assert cli.main(["gotchas", "--list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(GOTCHAS)
    assert all(r["how_means"] == KIND_LEGEND[r["how"]] for r in rows)


def _checkpoint(tmp_path, **fields):
    run = tmp_path / "runs" / "r"
    ckpt = run / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    (ckpt / MARKER).write_text("")
    TrainConfig(name="r", output_dir=str(tmp_path / "runs"), **fields).save(run / "config.yaml")
    return run, ckpt


def test_convert_says_it_merges_a_lora_adapter(tmp_path):
    from smolfsdp.checkpoint.convert import plan_convert

    run, ckpt = _checkpoint(tmp_path, lora=True, lora_r=8, lora_alpha=16)
    (ckpt / ".metadata").write_bytes(b"")  # the plan reads no tensor: the files need only exist
    plan = plan_convert(ckpt, tmp_path / "out").describe()
    assert "is a LoRA run (r=8, alpha=16, q_proj,k_proj,v_proj,o_proj)" in plan
    assert "merging the adapter into the base model tiny" in plan
    run2, ckpt2 = _checkpoint(tmp_path / "full")
    (ckpt2 / ".metadata").write_bytes(b"")
    assert (
        plan_convert(ckpt2, tmp_path / "out").describe()
        == f"converting {ckpt2} (model tiny) to model.safetensors"
    )


def test_stop_note_says_where_it_can_resume(tmp_path):
    run, ckpt = _checkpoint(tmp_path)
    summary = {"metrics": {"stopped_early": True, "steps": 3}}
    note = sft.stop_note(summary, run)
    assert note.startswith(
        f"stopped early at step 3 (stop_at_step): no final evaluation, no final model; it can resume from {ckpt}:"
    )
    assert sft.stop_note({"metrics": {"stopped_early": False, "steps": 3}}, run) is None
    empty = tmp_path / "runs" / "none"
    assert "no checkpoint was saved (save_steps 0)" in sft.stop_note(summary, empty)


def test_resume_command_is_the_same_command_without_the_stop():
    cmd = cli.resume_command(
        "configs/runs/smoke.yaml",
        ["--save_steps", "2", "--stop_at_step", "3", "--output-dir=/tmp/a b", "--lora"],
    )
    assert (
        cmd
        == "smolfsdp train --config configs/runs/smoke.yaml --save_steps 2 '--output-dir=/tmp/a b' --lora --resume"
    )
    assert cli.resume_command(None, ["--stop-at-step=3", "--resume"]) == "smolfsdp train --resume"


def test_umask_modes_undoes_safetensors_0600(tmp_path):
    from safetensors.torch import save_file

    old = os.umask(0o022)
    try:
        save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
        (tmp_path / "config.json").write_text("{}")
        assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == 0o600  # the cause
        umask_modes(tmp_path)
        assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {0o644}
    finally:
        os.umask(old)


@pytest.mark.parametrize("steps", [0])
def test_bench_table_without_timed_steps(steps):
    assert "no timed steps" in cli_output.format_bench({**CPU_BENCH, "summary": {"timed_steps": steps}})


# ------------------------------------------------------------------------------ help and argument errors
def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width


def test_train_help_has_description_default_and_section_per_field(capsys):
    text = _help(capsys, ["train", "--help"])
    for title in GROUPS:
        assert f" {title}: " in text
    assert (
        "--max_steps INT, --max-steps INT optimizer steps; > 0 overrides num_train_epochs (default: -1)"
        in text
    )
    assert "--lora [true|false] train LoRA adapters (peft) instead of all weights (default: false)" in text
    assert (
        "--fsdp_version INT, --fsdp-version INT 1 (FullyShardedDataParallel) or 2 (fully_shard, DTensor) (default: 1)"
        in text
    )
    assert "--no_save_final_model, --no-save-final-model same as --save_final_model false" in text
    assert "(default: q_proj k_proj v_proj o_proj)" in text
    # the sections in the order of GROUPS, each field under its own
    assert [text.index(f" {t}: ") for t in GROUPS] == sorted(text.index(f" {t}: ") for t in GROUPS)
    assert (
        text.index(" launch and faults: ") < text.index("--nnodes INT") < text.index("--collective_timeout_s")
    )
    assert "(default: None)" not in text and "==SUPPRESS==" not in text
    bench = _help(capsys, ["bench", "--help"])  # bench's own defaults, shown where they differ
    assert "bench.json, no saves (default: 5)" in bench and "runs/<name>/traces/ (default: true)" in bench


def test_top_level_help_is_plain_text(capsys):
    text = _help(capsys, ["--help"])
    assert "``" not in text
    assert all(c in text for c in ("train", "bench", "analyze-trace", "memory", "gotchas", "convert"))


def test_misspelt_option_refused_before_torch_is_imported():
    code = (
        "import sys; from smolfsdp.cli import main; rc = main(['train', '--max_step', '3']); "
        "print(rc, sorted(m for m in ('torch', 'transformers', 'trl', 'numpy', 'pandas') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2 []"
    assert done.stderr.strip() == (
        "smolfsdp: error: unknown option '--max_step' for train. Did you mean --max_steps? "
        "`smolfsdp train --help` lists every option."
    )
    # python -X importtime lists every module imported: `smolfsdp --help` imports no torch either
    imported = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "smolfsdp.cli", "--help"], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    modules = {line.split("|")[-1].strip() for line in imported.stderr.splitlines() if "|" in line}
    assert {"smolfsdp.cli_args", "smolfsdp.config", "yaml"} <= modules
    assert not {m for m in modules if m.split(".")[0] in ("torch", "transformers", "numpy")}


def test_argument_errors_exit_2_with_one_line(capsys):
    assert cli.main(["train", "--max_steps", "2.5"]) == 2
    assert capsys.readouterr().err == (
        "smolfsdp: error: argument --max_steps/--max-steps: invalid int value: '2.5'\n"
    )
    assert cli.main(["bench", "--profil"]) == 2
    assert "Did you mean --profile?" in capsys.readouterr().err
    assert cli.main(["trian", "--max_steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'trian'" in err and "Did you mean 'train'?" in err
    assert cli.main(["analyze-trace", "x.json", "--jsn"]) == 2
    assert "unknown option '--jsn' for analyze-trace. Did you mean --json?" in capsys.readouterr().err


# ------------------------------------------------------------------------------ --json everywhere
def test_every_subcommand_has_json():
    parser = cli.build_parser()
    assert set(parser.subcommands) == set(cli.COMMANDS)
    for name, sub in parser.subcommands.items():
        assert "--json" in {o for a in sub._actions for o in a.option_strings}, name


def test_train_json_is_one_document_and_the_log_goes_to_stderr(monkeypatch, tmp_path, capsys):
    from smolfsdp.launch import torchrun
    from smolfsdp.measure import results

    def fake_launch(cfg, **kw):
        print("rank 0: step 1/2 loss 6.9")  # what the ranks stream while training
        return subprocess.CompletedProcess([], 0)

    data = {"mapping": "medical_o1", "rows_in": 180, "kept": 160, "dropped_empty_question": 0}
    data |= {"dropped_too_long": 20, "reasoning_cut": 0, "train_rows": 144, "eval_rows": 16}
    monkeypatch.setattr(
        runner, "preflight", lambda cfg, progress=None: {"wrap_class": "SmolLM3DecoderLayer", "data": data}
    )
    monkeypatch.setattr(torchrun, "launch", fake_launch)
    summary = {"metrics": {"steps": 2, "stopped_early": False}}
    monkeypatch.setattr(results, "load_run", lambda path: type("Run", (), {"summary": summary})())
    assert cli.main(["train", "--json", "--max_steps", "2", "--output_dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"returncode": 0, "run_dir": str(tmp_path / "smoke"), "summary": summary}
    assert "rank 0: step 1/2 loss 6.9" in err and "[smolfsdp] smoke: engine=native" in err
    # the preflight's row accounting as a sentence, not a dict
    assert "data: 160 of 180 rows kept (dropped: 20 too long), 144 train / 16 eval, columns medical_o1" in err


def test_resume_flag_is_resume_from(monkeypatch, tmp_path):
    """``--resume`` alone is the latest complete checkpoint; ``--resume PATH`` that one."""
    from smolfsdp.launch import torchrun

    seen = []
    monkeypatch.setattr(
        runner, "preflight", lambda cfg, progress=None: {"wrap_class": "X", "data": "bundled"}
    )
    monkeypatch.setattr(
        torchrun,
        "launch",
        lambda cfg, **kw: seen.append(cfg.resume_from) or subprocess.CompletedProcess([], 1),
    )
    assert cli.main(["train", "--resume", "--output_dir", str(tmp_path)]) == 1
    assert cli.main(["train", "--resume", "runs/x/checkpoints/step-2", "--max_steps", "4"]) == 1
    assert cli.main(["train", "--max_steps", "4"]) == 1
    assert seen == ["latest", "runs/x/checkpoints/step-2", None]


def test_convert_json(monkeypatch, tmp_path, capsys):
    from smolfsdp.checkpoint import convert

    run, ckpt = _checkpoint(tmp_path, lora=True)
    (ckpt / ".metadata").write_bytes(b"")

    def fake_convert(plan):
        plan.out.mkdir()
        (plan.out / "model.safetensors").write_text("")
        return plan.out

    monkeypatch.setattr(convert, "convert_checkpoint", fake_convert)
    assert cli.main(["convert", str(ckpt), str(tmp_path / "out"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {
        "checkpoint": str(ckpt),
        "out": str(tmp_path / "out"),
        "model": "tiny",
        "lora_merged": True,
        "files": ["model.safetensors"],
    }
    assert "merging the adapter" in err


# ------------------------------------------------------------------------------ analyze-trace as text
SAMPLED = SHARED / "traces" / "sampled_128rank_rank0.json.gz"


def test_analyze_trace_text_shows_what_the_json_holds(capsys):
    if not SAMPLED.is_file():
        pytest.skip(f"{SAMPLED} is absent: the real GPU traces live in ../shared/traces/ (CI has them)")
    assert cli.main(["analyze-trace", str(SAMPLED), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)[0]
    assert cli.main(["analyze-trace", str(SAMPLED)]) == 0
    text = capsys.readouterr().out
    assert f"(GPU trace, {data['events']:,} events)" in text and "4,811 events" in text
    lines = text.splitlines()
    # per thread and stream: one line per (step, row), busy and idle in ms
    for r in data["rows"]:
        line = next(x for x in lines if x.startswith(f"{r['step']}") and f" {r['row']} " in x)
        assert f"{r['busy_us'] / 1000:,.1f}" in line and f"{r['idle_us'] / 1000:,.1f}" in line
    assert "thread 4037 (python3.8)" in text and "GPU 0 stream 84" in text
    assert "Collectives bunched at step boundaries" in text
    step = data["steps"][0]
    row = next(
        x
        for x in lines[lines.index(next(x for x in lines if x.startswith("Collectives"))) :]
        if x.startswith("551")
    )
    assert row.split() == ["551", "2", "45.6", "1", "1.9"]  # head: 2 collectives, 45.6 ms; tail: 1, 1.9 ms
    assert step["collectives_head"] == 2
    assert "Per-layer FSDP all-gathers" in text
    assert "none: no all-gather in this trace belongs to an FSDP unit" in text
    assert "note: no FSDP unit in this trace: its 2 all-gathers are not FSDP's" in text
    assert "{" not in text  # no raw dicts


def test_analyze_trace_text_per_layer_gathers(tmp_path, capsys):
    path = _write(tmp_path / "fsdp2.json", _fsdp2_gpu_trace(n_layers=2))
    assert cli.main(["analyze-trace", str(path)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    start = lines.index("Per-layer FSDP all-gathers, all steps")
    assert lines[start + 1].split() == [
        "FSDP",
        "unit",
        "forward:",
        "count",
        "mean",
        "µs",
        "backward:",
        "count",
        "mean",
        "µs",
    ]
    assert [x.split() for x in lines[start + 3 : start + 6]] == [
        ["root", "1", "30", "0", "-"],
        ["model.layers.0", "1", "30", "1", "30"],
        ["model.layers.1", "1", "30", "1", "30"],
    ]
    assert "(attributed by: NCCL kernel, FSDP:: annotation)" in text


def test_memory_prints_the_one_verdict_for_the_issue_41_example(capsys):
    """SHARD_GRAD_OP x 2, 4,096 tokens, activation checkpointing, A100 40GB (issue 41: "does not fit (peak 31.1
    of 37.3)" while its verdict was on 39.5 GiB): the text and ``--json`` say ``fit_verdict``'s word with the need
    it is decided on and the tensor peak, as ``recommend`` does (and the explorer and fit_table:
    tests/test_fit_explorer.py)."""
    kw = {"strategy": "SHARD_GRAD_OP", "seq_len": 4096, "activation_checkpointing": True, "fsdp_version": 2}
    est = estimate_memory("smollm3-3b", world_size=2, **kw)
    want = fit_verdict(est, GPUS["A100 40GB"])
    args = ["memory", "--gpus", "2", "--strategy", "SHARD_GRAD_OP", "--seq-len", "4096"]
    args += ["--activation-checkpointing", "--fsdp-version", "2", "--gpu", "A100 40GB"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"verdict on A100 40GB: {want.line}\n" in out
    asked = "asked FSDP2 SHARD_GRAD_OP + activation checkpointing on 2 x A100 40GB"
    assert f"Does FSDP fit? {asked}: {want.line}." in out
    # the CLI asks recommend from a full replica (is FSDP needed at all?); its walk passes the asked setting
    rec = recommend("smollm3-3b", "A100 40GB", 2, **{k: v for k, v in kw.items() if k != "strategy"})
    assert ("SHARD_GRAD_OP + activation checkpointing", want) in rec.tried
    assert f"SHARD_GRAD_OP + activation checkpointing: {want.line}" in rec.reason and rec.reason in out
    assert cli.main([*args, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["verdict"] == want.to_dict() and said["fits"] is want.fits
    assert (
        said["verdict"]["need_bytes"] == est.device_need_bytes
        and said["verdict"]["peak_bytes"] == est.peak_bytes
    )
    assert said["recommendation"]["verdict"] == rec.fit.to_dict() and rec.fit.word == "fits"


def test_memory_on_one_gpu_says_one_gpu(capsys):
    """``--gpus 1``: "1 GPU", never "1 GPU(s)" or "1 ranks"."""
    assert cli.main(["memory", "--gpus", "1", "--seq-len", "4096", "--gpu", "A10G"]) == 0
    out = capsys.readouterr().out
    assert "over 1 GPU (shard group 1)" in out and "on 1 GPU, because" in out
    assert "GPU(s)" not in out and "1 ranks" not in out


def test_fit_verdict_line_names_the_recommended_gpu_count():
    assert cli_output.gpus_words(1) == "1 GPU" and cli_output.gpus_words(1024) == "1,024 GPUs"
