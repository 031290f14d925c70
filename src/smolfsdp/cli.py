"""The smolfsdp command line (`smolfsdp --help`; each command has its own --help).

    smolfsdp train [--config configs/runs/smoke.yaml] [--<field> <value> ...] [--resume [CHECKPOINT]]
    smolfsdp train --config C --nproc 16 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 [--max-restarts 3]
    smolfsdp bench [--config configs/runs/smoke.yaml] [--benchmark_steps 5] [--profile false] [--<field> ...]
    smolfsdp analyze-trace runs/bench/traces/rank0.json.gz
    smolfsdp memory --model smollm3-3b --gpus 2 --strategy FULL_SHARD --seq-len 4096
    smolfsdp dryrun --config configs/runs/smollm3_3b_medical.yaml [--gpus 4] [--json]
    smolfsdp gotchas [--list] [--run NAME]
    smolfsdp convert runs/<name>/checkpoints/step-N OUT

Every command prints tables for people and JSON with --json. train and bench take every TrainConfig
field as an option (--max_steps 20 or --max-steps=20), described with its default in `smolfsdp train
--help`; a --config YAML gives the rest. Outside torchrun the train command checks the configuration,
then starts nproc processes itself; inside them (RANK set) it trains.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys

from smolfsdp import quiet
from smolfsdp.cli_args import command_hint, field_parser, option_names, overrides_from, refuse_unknown
from smolfsdp.cli_dryrun import add_dryrun_parser, cmd_dryrun
from smolfsdp.cli_memory import add_memory_parser, cmd_memory
from smolfsdp.cli_output import format_bench, format_data, format_trace, status
from smolfsdp.config import TrainConfig, load_config
from smolfsdp.errors import ConfigError

# Only light modules above: a misspelt option is answered before torch and transformers load. Each
# command imports its heavy modules itself (torch, transformers, trl, our engines), the one exception
# to "no imports inside functions", commented where it happens.


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    """Launch ``nproc`` processes (or, inside torchrun, be one rank) and say where the run went."""
    if (rank := os.environ.get("RANK")) is None:  # the launcher (is_launched's test, before torch loads)
        status(sys.stderr if args.json else sys.stdout)(
            "train: loading torch, then checking the configuration"
        )
    elif rank == "0":  # a rank: what it does before its first logged line
        print("[rank0] started: loading torch, the model and the data", flush=True)
    from smolfsdp.launch.host_checks import check_runs_here  # deferred: imports torch, as validate
    from smolfsdp.launch.validate import validate  # deferred: imports torch, as is_launched below
    from smolfsdp.sharding.distributed import is_launched  # deferred: imports torch

    overrides = overrides_from(args)
    if args.resume is not None:  # --resume: the latest complete checkpoint; --resume PATH: that one
        overrides["resume_from"] = args.resume
    cfg = validate(load_config(args.config, **overrides))  # model, mesh, launch fields: before any work
    accelerate = getattr(args, "accelerate_config", None)
    if accelerate is not None and not is_launched():
        from smolfsdp.launch.accelerate_launch import check_accelerate_config  # deferred: the config stack

        check_accelerate_config(cfg, accelerate)  # its process count, before any rank starts
    check_runs_here(
        cfg
    )  # GPUs for a 3B model, the Hub for an uncached one: one line, before any rank or folder
    if is_launched():
        from smolfsdp.launch.torchrun import resume_on_restart  # deferred: the training stack
        from smolfsdp.sharding.distributed import init_distributed, name_collective_errors  # deferred: torch
        from smolfsdp.train.sft import train  # deferred: the training stack

        cfg = resume_on_restart(cfg)  # after torchrun's elastic restart: continue from the latest checkpoint
        init_distributed(cfg.collective_timeout_s, cpu_offload=cfg.cpu_offload)  # train() joins this group
        with name_collective_errors():
            train(cfg)
        return 0
    from smolfsdp.launch.runner import preflight  # deferred: transformers, peft
    from smolfsdp.launch.torchrun import launch  # deferred: torch

    # with --json, stdout carries one JSON document: the ranks' log goes to stderr
    log = sys.stderr if args.json else sys.stdout
    found = preflight(cfg, progress=status(log))  # tokenising, model shapes: said as they start
    print(
        f"[smolfsdp] {cfg.name}: engine={cfg.engine} fsdp_version={cfg.fsdp_version} nproc={cfg.nproc} "
        f"model={cfg.model} wrap={found['wrap_class']}; data: {format_data(found['data'])}",
        file=log,
        flush=True,
    )
    with contextlib.redirect_stdout(log):
        proc = launch(cfg, accelerate_config=accelerate)
    summary = _summary(cfg) if proc.returncode == 0 else None
    resume = stop_message(summary, cfg, args.config, argv) if summary else None
    if args.json:
        print(json.dumps({"returncode": proc.returncode, "run_dir": str(cfg.run_dir), "summary": summary}))
    elif proc.returncode == 0:
        print(f"[smolfsdp] run folder: {cfg.run_dir}", flush=True)
        if resume:  # rank 0 said why it stopped; the command goes last, where it is seen
            print(f"[smolfsdp] {resume}")
    return proc.returncode


def _summary(cfg: TrainConfig) -> dict:
    from smolfsdp.measure.results import load_run  # deferred: pandas

    return load_run(cfg.run_dir).summary


def stop_message(summary: dict, cfg: TrainConfig, config: str | None, argv: list[str]) -> str | None:
    """For a run ended by ``--stop_at_step``: where it stopped and the command that resumes it."""
    if not cfg.stop_at_step:
        return None
    from smolfsdp.train.sft import stop_note  # deferred: the training stack

    note = stop_note(summary, cfg.run_dir)
    if note and "can resume" in note:
        step = summary["metrics"]["steps"]
        return f"stopped early at step {step}; resume with: {resume_command(config, argv)}"
    return note


def resume_command(config: str | None, overrides: list[str]) -> str:
    """The ``smolfsdp train`` command that continues a run stopped by ``--stop_at_step``: the same
    config and options, without the stop, with ``--resume`` (the latest complete checkpoint)."""
    keep, i = [], 0
    while i < len(overrides):
        key = overrides[i][2:].partition("=")[0].replace("-", "_") if overrides[i].startswith("--") else ""
        has_value = (
            "=" not in overrides[i] and i + 1 < len(overrides) and not overrides[i + 1].startswith("--")
        )
        if key in ("stop_at_step", "resume", "resume_from", "config", "json"):
            i += 2 if has_value and key != "json" else 1
            continue
        keep.append(overrides[i])
        i += 1
    words = ["smolfsdp", "train"] + (["--config", config] if config else []) + keep + ["--resume"]
    return shlex.join(words)


#: bench's own defaults: they override a --config recipe too (a run named bench unless --name is given)
BENCH_DEFAULTS = {"benchmark_steps": 5, "profile": True, "name": "bench"}


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark mode: warm-up + timed steps (default 5, profiled), then a table of bench.json's summary
    (``--json``: summary, MFU reason, trace paths). Says each stage from its first second: checks, launch."""
    cfg = load_config(args.config, **(BENCH_DEFAULTS | overrides_from(args)))
    log = sys.stderr if args.json else sys.stdout  # with --json, stdout carries one JSON document
    say = status(log)
    say(
        f"bench {cfg.name}: {cfg.benchmark_steps} steps ({cfg.benchmark_warmup_steps} warm-up) on {cfg.nproc} "
        f"processes{', profiled' if cfg.profile else ''}; loading torch and checking the configuration"
    )
    from smolfsdp.launch.runner import preflight  # deferred: torch
    from smolfsdp.launch.torchrun import launch  # deferred: torch
    from smolfsdp.measure.benchmark import load_bench  # deferred: torch

    if cfg.benchmark_steps <= 0:
        raise ConfigError("bench needs --benchmark_steps > 0 (the timed steps, warm-up included).")
    preflight(cfg, progress=say)
    say(
        f"launching {cfg.nproc} processes (torchrun); each loads and shards the model, rank 0 reports from there"
    )
    with contextlib.redirect_stdout(log):
        proc = launch(cfg)
    if proc.returncode != 0:  # launch has printed why (explain_failure)
        return proc.returncode
    bench = load_bench(cfg.run_dir)
    if args.json:
        keys = ("strategy", "summary", "mfu_reason", "memory_per_rank", "traces")
        print(json.dumps({k: bench.get(k) for k in keys}, indent=2))
        return 0
    print(format_bench(bench))
    print(f"[smolfsdp] {cfg.run_dir / 'bench.json'}", flush=True)
    return 0


def cmd_gotchas(args: argparse.Namespace) -> int:
    if args.list or args.run is None:  # the catalogue alone: answers in a second, without torch
        from smolfsdp.gotchas.registry import format_list  # deferred: only gotchas needs the catalogue

        print(format_list(as_json=args.json))
        return 0
    print(f"[smolfsdp] gotchas {args.run}: loading torch and the cases", file=sys.stderr, flush=True)
    from smolfsdp.gotchas.run_all import main as gotchas_main  # deferred: torch, peft

    flags = ["--list"] * args.list + ["--json"] * args.json
    flags += ["--run", args.run] * bool(args.run) + ["--out", args.out] * bool(args.out)
    return gotchas_main(flags)


def cmd_convert(args: argparse.Namespace) -> int:
    """Check the path, the output folder and the model first (one line on a problem), then say what it
    writes and write it; the model and ``trust_remote_code`` come from the command line, not the checkpoint."""
    from smolfsdp.checkpoint.convert import convert_checkpoint, plan_convert  # deferred: torch, transformers

    plan = plan_convert(
        args.checkpoint,
        args.out,
        overwrite=args.overwrite,
        model=args.model,
        trust_remote_code=args.trust_remote_code,
    )
    print(f"[smolfsdp] {plan.describe()}", file=sys.stderr if args.json else sys.stdout, flush=True)
    out = convert_checkpoint(plan)
    if args.json:
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        print(
            json.dumps(
                {
                    "checkpoint": args.checkpoint,
                    "out": str(out),
                    "model": plan.cfg.model,
                    "lora_merged": plan.cfg.lora,
                    "files": files,
                }
            )
        )
    else:
        print(f"[smolfsdp] wrote {out}")
    return 0


def cmd_analyze_trace(args: argparse.Namespace) -> int:
    """Analyse each trace; tables per trace, or one JSON list with ``--json``."""
    from smolfsdp.traces.analysis import TraceError, summarize_trace  # deferred: pandas, numpy

    out = []
    for path in args.paths:
        try:
            out.append(summarize_trace(path, progress=True))  # the bar shows on reads over 2 s
        except (TraceError, FileNotFoundError) as err:
            print(f"smolfsdp: error: {err}", file=sys.stderr)
            return 2
        except MemoryError:  # a memory limit below the loader's bounds (smolfsdp.traces.load.limits)
            hint = "lower SMOLFSDP_TRACE_MAX_BYTES / _MAX_EVENTS to be refused early, or give it more memory"
            print(f"smolfsdp: error: {path}: ran out of memory reading the trace; {hint}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(out, indent=2, allow_nan=False))  # strict JSON: summarize_trace writes null, not NaN
    else:
        print("\n\n".join(format_trace(s) for s in out))
    return 0


COMMANDS = {
    "train": cmd_train,
    "bench": cmd_bench,
    "analyze-trace": cmd_analyze_trace,
    "memory": cmd_memory,
    "dryrun": cmd_dryrun,
    "gotchas": cmd_gotchas,
    "convert": cmd_convert,
}


def build_parser() -> argparse.ArgumentParser:
    """``smolfsdp`` and its subcommands; train and bench take every TrainConfig field (:mod:`smolfsdp.cli_args`)."""
    parser = argparse.ArgumentParser(
        prog="smolfsdp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        exit_on_error=False,  # main prints argument errors in the same form as the others
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.subcommands = sub.choices  # name -> subparser, for refuse_unknown's list of options
    fields, bench_fields = field_parser(), field_parser(BENCH_DEFAULTS)
    common = {
        "formatter_class": argparse.RawDescriptionHelpFormatter,
        "allow_abbrev": False,
        "exit_on_error": False,
    }
    recipe = {
        "default": None,
        "metavar": "YAML",
        "help": "a run recipe, e.g. configs/runs/smoke.yaml; options override it",
    }
    p = sub.add_parser(
        "train",
        parents=[fields],
        help="fine-tune (launches nproc processes unless already launched)",
        usage="smolfsdp train [--config YAML] [--<field> VALUE ...] [--resume [CHECKPOINT]] [--json]",
        description="Fine-tune: check the configuration, then launch nproc processes (torchrun).",
        **common,
    )
    p.add_argument("--config", **recipe)
    p.add_argument(
        "--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
        help="continue from the latest complete checkpoint, or from CHECKPOINT (same as --resume_from)",
    )  # fmt: skip
    p.add_argument(
        "--json", action="store_true", help="print the run's summary.json (the log goes to stderr)"
    )
    p.add_argument(
        "--accelerate_config", default=None, metavar="YAML",
        help="launch with `accelerate launch --config_file YAML` instead of torchrun, after the same checks",
    )  # fmt: skip
    p = sub.add_parser(
        "bench",
        parents=[bench_fields],
        help="benchmark mode: timed steps, bench.json, profiler traces",
        usage="smolfsdp bench [--config YAML] [--<field> VALUE ...] [--json]",
        description="Benchmark mode: warm-up, timed steps and profiler traces; no checkpoints.",
        **common,
    )
    p.add_argument("--config", **recipe)
    p.add_argument("--json", action="store_true", help="the summary as JSON instead of a table")
    p = sub.add_parser("analyze-trace", help="busy/idle, overlap, per-layer all-gathers of traces", **common)
    p.add_argument("paths", nargs="+", help=".json or .json.gz PyTorch profiler traces")
    p.add_argument("--json", action="store_true", help="one JSON list, one object per trace (strict JSON)")
    add_memory_parser(sub, common)
    add_dryrun_parser(sub, common)
    p = sub.add_parser("gotchas", help="reproduce the FSDP gotchas, failing and fixed", **common)
    p.add_argument("--list", action="store_true", help="list the gotchas")
    p.add_argument("--run", default=None, help="a gotcha name, several joined by commas, or 'all'")
    p.add_argument("--out", default=None, help="folder for the results")
    p.add_argument("--json", action="store_true", help="print the list or the results as JSON")
    p = sub.add_parser("convert", help="DCP checkpoint -> model.safetensors + config + tokenizer", **common)
    p.add_argument("checkpoint", help="runs/<name>/checkpoints/step-N")
    p.add_argument("out", help="output folder (must be new or empty unless --overwrite)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an earlier convert's output in OUT (nothing else)"
    )
    p.add_argument(
        "--model", default=None,
        help="the model to rebuild (default: the one the run's config.yaml names, if a preset or a local "
        "folder outside the checkpoint; a checkpoint's own word is never trusted further)",
    )  # fmt: skip
    p.add_argument(
        "--trust_remote_code", action="store_true",
        help="run the --model's own modelling code (off unless given here; a checkpoint's setting is ignored)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, rest = parser.parse_known_args(argv)
        refuse_unknown(rest, args.command, option_names(parser.subcommands[args.command]))
    except (argparse.ArgumentError, ConfigError) as err:
        print(f"smolfsdp: error: {err}{command_hint(err, argv, COMMANDS)}", file=sys.stderr)
        return 2
    quiet.install()  # known harmless third-party warnings (the list and why: smolfsdp.quiet)
    try:
        if args.command == "train":
            return cmd_train(args, argv[argv.index("train") + 1 :])
        return COMMANDS[args.command](args)
    except ConfigError as err:
        print(f"smolfsdp: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        # Ctrl-C, or SIGTERM (smolfsdp.launch.torchrun.Terminated) to the launcher
        how = str(err) or "interrupted"
        print(
            f"smolfsdp: {how}; the ranks were asked to stop (checkpoints already complete are kept)",
            file=sys.stderr,
        )
        return 143 if type(err).__name__ == "Terminated" else 130


if __name__ == "__main__":
    sys.exit(main())
