"""``smolfsdp`` command line.

    smolfsdp train [--config configs/runs/smoke.yaml] [--<field> <value> ...] [--resume]
    smolfsdp train --config C --nproc 16 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 [--max-restarts 3]
    smolfsdp memory --model smollm3-3b --gpus 2 --strategy FULL_SHARD --seq-len 4096 [--json]
    smolfsdp gotchas [--list] [--run NAME] [--json]
    smolfsdp bench [--config configs/runs/smoke.yaml] [--benchmark_steps 5] [--profile true] [--<field> ...]
    smolfsdp analyze-trace runs/bench/traces/rank0.json.gz [--json]

Any ``TrainConfig`` field can be overridden (``--max_steps 20`` or ``--max-steps=20``). Outside
torchrun/accelerate the command checks the configuration, then starts ``nproc`` processes itself;
inside them (``RANK`` set) it trains. ``--resume`` is ``--resume_from latest``; the launch fields
(``nnodes``, ``node_rank``, ``rdzv_endpoint``, ``max_restarts``, ``collective_timeout_s``) are
described in ``smolfsdp.launch.torchrun``.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError


def parse_overrides(tokens: list[str]) -> dict:
    """``["--max-steps", "20", "--cpu_offload=true"]`` -> ``{"max_steps": 20, "cpu_offload": True}``."""
    out, i = {}, 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"Unexpected argument {tok!r}; overrides look like --field value.")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                value = "true"  # a bare flag
            else:
                i += 1
                value = tokens[i]
        out[key.replace("-", "_")] = yaml.safe_load(value) if value != "" else ""
        i += 1
    return out


def cmd_train(args: argparse.Namespace, rest: list[str]) -> int:
    # deferred, as every command's imports here: they pull in torch, which `smolfsdp memory` never needs
    from smolfsdp.launch.validate import validate
    from smolfsdp.sharding.distributed import is_launched

    overrides = parse_overrides(rest)
    if "resume" in overrides:  # --resume: the latest complete checkpoint; --resume PATH: that one
        resume = overrides.pop("resume")
        if resume not in (False, None):
            overrides["resume_from"] = "latest" if resume is True else str(resume)
    cfg = validate(load_config(args.config, **overrides))  # model, mesh, launch fields: before any work
    if is_launched():
        from smolfsdp.launch.torchrun import resume_on_restart
        from smolfsdp.sharding.distributed import init_distributed, name_collective_errors
        from smolfsdp.train.sft import train

        cfg = resume_on_restart(cfg)  # after torchrun's elastic restart: continue from the latest checkpoint
        init_distributed(cfg.collective_timeout_s, cpu_offload=cfg.cpu_offload)  # train() joins this group
        with name_collective_errors():
            train(cfg)
        return 0
    from smolfsdp.launch.runner import preflight
    from smolfsdp.launch.torchrun import launch

    found = preflight(cfg)
    print(
        f"[smolfsdp] {cfg.name}: engine={cfg.engine} fsdp_version={cfg.fsdp_version} nproc={cfg.nproc} "
        f"model={cfg.model} wrap={found['wrap_class']} data={found['data']}",
        flush=True,
    )
    proc = launch(cfg)
    if proc.returncode == 0:
        print(f"[smolfsdp] run folder: {cfg.run_dir}", flush=True)
        if cfg.stop_at_step:  # rank 0 said why it stopped; the command goes last, where it is seen
            from smolfsdp.measure.results import load_run
            from smolfsdp.train.sft import stop_note

            summary = load_run(cfg.run_dir).summary
            note = stop_note(summary, cfg.run_dir)
            if note and "can resume" in note:
                step = summary["metrics"]["steps"]
                print(
                    f"[smolfsdp] stopped early at step {step}; resume with: {resume_command(args.config, rest)}"
                )
            elif note:
                print(f"[smolfsdp] {note}")
    return proc.returncode


def resume_command(config: str | None, overrides: list[str]) -> str:
    """The ``smolfsdp train`` command that continues a run stopped by ``--stop_at_step``: the same
    config and overrides, without the stop, with ``--resume`` (the latest complete checkpoint)."""
    import shlex

    keep, i = [], 0
    while i < len(overrides):
        key = overrides[i][2:].partition("=")[0].replace("-", "_") if overrides[i].startswith("--") else ""
        has_value = (
            "=" not in overrides[i] and i + 1 < len(overrides) and not overrides[i + 1].startswith("--")
        )
        if key in ("stop_at_step", "resume", "resume_from"):
            i += 2 if has_value else 1
            continue
        keep.append(overrides[i])
        i += 1
    words = ["smolfsdp", "train"] + (["--config", config] if config else []) + keep + ["--resume"]
    return shlex.join(words)


def cmd_memory(args: argparse.Namespace) -> int:
    """Print the per-rank memory estimate, the verdict for the chosen GPU, or JSON with ``--json``."""
    import json

    from smolfsdp.measure.hardware import fits, get_gpu, recommend
    from smolfsdp.measure.memory import format_table

    # --gpu-memory-gib alone describes a custom GPU; without either, the H100 SXM is the default
    gpu = get_gpu(args.gpu or (None if args.gpu_memory_gib else "H100 SXM"), args.gpu_memory_gib)
    common = {
        "recipe": args.recipe,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "lora": args.lora,
        "activation_checkpointing": args.activation_checkpointing,
        "fsdp_version": args.fsdp_version,
        "gpus_per_node": args.gpus_per_node,
    }
    from smolfsdp.measure.memory import estimate_memory

    est = estimate_memory(
        args.model, world_size=args.gpus, strategy=args.strategy, offload=args.offload, **common
    )
    rec = recommend(args.model, gpu, args.gpus, **common)
    verdict = "fits" if fits(est, gpu) else "does not fit"
    if args.json:
        out = {
            "estimate": est.to_dict(),
            "gpu": {"name": gpu.name, "memory_bytes": gpu.memory_bytes},
            "fits": fits(est, gpu),
            "recommendation": {"decision": rec.decision, "gpus": rec.gpus, "reason": rec.reason},
        }
        print(json.dumps(out, indent=2))
    else:
        print(format_table(est))
        print(f"\nverdict: {verdict} on {gpu.name} ({gpu.memory_bytes / 2**30:.1f} GiB)")
        print(f"Does FSDP fit? {rec.decision} on {rec.gpus} GPU(s): {rec.reason}")
    return 0


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    """Benchmark mode: warm-up + timed steps (default 5, profiled), then a table of bench.json's
    summary (``--json``: the summary, MFU reason and trace paths as JSON)."""
    import json

    from smolfsdp.launch.runner import run_benchmark  # deferred: imports torch (see cmd_train)

    overrides = parse_overrides(rest)
    overrides.setdefault("benchmark_steps", 5)
    overrides.setdefault("profile", True)
    overrides.setdefault("name", "bench")
    cfg = load_config(args.config, **overrides)
    bench = run_benchmark(cfg)  # validates cfg first (runner.preflight)
    if args.json:
        keys = ("strategy", "summary", "mfu_reason", "memory_per_rank", "traces")
        print(json.dumps({k: bench.get(k) for k in keys}, indent=2))
        return 0
    print(format_bench(bench))
    print(f"[smolfsdp] {cfg.run_dir / 'bench.json'}", flush=True)
    return 0


def _size(n: float | None) -> str:
    """Bytes in MiB below 1 GiB, else GiB (binary units, as nvidia-smi and torch report them)."""
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def format_bench(bench: dict) -> str:
    """bench.json as a small table with units: step time, throughput, TFLOP/s, MFU (or why there is
    none), peak memory per rank, and the strategy that ran (which may differ from the one asked)."""
    s = bench["summary"]
    if not s.get("timed_steps"):
        return "no timed steps: benchmark_steps must exceed benchmark_warmup_steps"
    mfu = s.get("mfu_median")
    rows = [
        (
            "strategy that ran",
            f"{bench['strategy']} ({bench['engine']} engine, {bench['world_size']} ranks, "
            f"{bench['device_name'] or bench['device']})",
        ),
        ("timed steps", f"{s['timed_steps']} (after {bench['warmup_steps']} warm-up)"),
        (
            "step time, median",
            f"{s['step_time_ms_median']:.1f} ms "
            f"(min {s['step_time_ms_min']:.1f}, max {s['step_time_ms_max']:.1f})",
        ),
        (
            "tokens/s, all ranks",
            f"{s['tokens_per_s_median']:,.0f} ({s['tokens_per_step_mean']:,.0f} tokens/step)",
        ),
        ("TFLOP/s per rank", f"{s['tflops_median']:.4g}"),
        ("MFU", f"{100 * mfu:.1f} %" if mfu is not None else f"- ({bench['mfu_reason']})"),
    ]
    for rank, m in enumerate(bench.get("memory_per_rank") or []):
        if "max_memory_allocated_bytes" in m:
            mem = (
                f"{_size(m['max_memory_allocated_bytes'])} allocated, "
                f"{_size(m['max_memory_reserved_bytes'])} reserved (GPU peak in the step)"
            )
        else:
            mem = (
                f"{_size(m['rss_peak_bytes'])} process RSS peak, {_size(m['tensor_bytes'])} in parameters, "
                "gradients and optimizer state"
            )
        rows.append((f"memory, rank {rank}", mem))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def convert_plan(checkpoint: str) -> str:
    """What ``convert`` is about to write: a plain model, or a LoRA run's adapter merged into its base."""
    from smolfsdp.checkpoint.dcp import config_of

    path = config_of(checkpoint)
    if not path.is_file():  # convert_checkpoint raises the error that names the problem
        return f"[smolfsdp] converting {checkpoint}"
    cfg = load_config(path)
    if not cfg.lora:
        return f"[smolfsdp] converting {checkpoint} (model {cfg.model}) to model.safetensors"
    return (
        f"[smolfsdp] {checkpoint} is a LoRA run (r={cfg.lora_r}, alpha={cfg.lora_alpha}, "
        f"{','.join(cfg.lora_target_modules)}): merging the adapter into the base model {cfg.model}; "
        "the output is one plain model (to keep the adapter alone, use the run's final_model/adapter)"
    )


def cmd_analyze_trace(args: argparse.Namespace) -> int:
    """Analyse each trace; a table per trace, or one JSON list with ``--json``."""
    import json

    import pandas as pd

    from smolfsdp.traces.analysis import TraceError, summarize_trace

    out = []
    for path in args.paths:
        try:
            out.append(summarize_trace(path, progress=True))  # the bar shows on reads over 2 s
        except (TraceError, FileNotFoundError) as err:
            print(f"smolfsdp: error: {err}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(out, indent=2, allow_nan=False))  # strict JSON: summarize_trace writes null, not NaN
        return 0
    cols = ["step", "dur_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us", "overlap_pct"]
    for s in out:
        print(f"== {s['path']} ({s['mode']} trace, {s['events']:,} events)")
        for note in s["notes"]:
            print(f"   note: {note}")
        print(pd.DataFrame(s["steps"])[cols].round(1).to_string(index=False))
        print(f"prefetch: {s['prefetch']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="smolfsdp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    from smolfsdp.config import field_names

    p_train = sub.add_parser(
        "train",
        help="fine-tune (launches nproc processes unless already launched)",
        epilog="Any TrainConfig field can be given as --<field> <value>: " + ", ".join(field_names()),
    )
    p_train.add_argument("--config", default=None, help="a run recipe, e.g. configs/runs/smoke.yaml")
    p_mem = sub.add_parser("memory", help="per-GPU memory estimate, fit verdict and recommendation")
    p_mem.add_argument(
        "--model", default="smollm3-3b", help="smollm3-3b, tiny, a dir with config.json, or a hub id"
    )
    p_mem.add_argument("--gpus", type=int, default=1, help="world size")
    p_mem.add_argument(
        "--strategy", default="FULL_SHARD", help="NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD"
    )
    p_mem.add_argument(
        "--recipe", default="hf-fsdp-bf16", help="precision recipe (see smolfsdp.measure.memory.RECIPES)"
    )
    p_mem.add_argument("--seq-len", type=int, default=2048)
    p_mem.add_argument("--micro-batch", type=int, default=1)
    p_mem.add_argument("--lora", action="store_true", help="LoRA r=8 on q/k/v/o")
    p_mem.add_argument("--offload", action="store_true", help="CPU offload of params, grads, optimizer state")
    p_mem.add_argument("--activation-checkpointing", action="store_true")
    p_mem.add_argument("--fsdp-version", type=int, default=2)
    p_mem.add_argument("--gpus-per-node", type=int, default=8)
    p_mem.add_argument(
        "--gpu", default=None, help="a GPU from smolfsdp.measure.hardware.GPUS (default: H100 SXM)"
    )
    p_mem.add_argument("--gpu-memory-gib", type=float, default=None, help="a GPU not in the table, by memory")
    p_mem.add_argument("--json", action="store_true")
    p_got = sub.add_parser(
        "gotchas", help="reproduce the FSDP gotchas, failing and fixed (smolfsdp.book.gotchas)"
    )
    p_got.add_argument("--list", action="store_true", help="list the gotchas")
    p_got.add_argument("--run", default=None, help="a gotcha name, several joined by commas, or 'all'")
    p_got.add_argument("--json", action="store_true")
    p_got.add_argument("--out", default=None, help="folder for the results")
    p_conv = sub.add_parser("convert", help="DCP checkpoint -> model.safetensors + config + tokenizer")
    p_conv.add_argument("checkpoint", help="runs/<name>/checkpoints/step-N")
    p_conv.add_argument("out", help="output folder (must be new or empty unless --overwrite)")
    p_conv.add_argument("--overwrite", action="store_true")
    p_bench = sub.add_parser("bench", help="benchmark mode: timed steps, bench.json, profiler traces")
    p_bench.add_argument("--config", default=None, help="a run recipe, e.g. configs/runs/smoke.yaml")
    p_bench.add_argument("--json", action="store_true", help="the summary as JSON instead of a table")
    p_trace = sub.add_parser("analyze-trace", help="busy/idle, overlap, per-layer all-gathers of traces")
    p_trace.add_argument("paths", nargs="+", help=".json or .json.gz profiler traces")
    p_trace.add_argument("--json", action="store_true")
    args, rest = parser.parse_known_args(argv)
    from smolfsdp import quiet

    quiet.install()  # known harmless third-party warnings (the list and why: smolfsdp.quiet)
    try:
        if args.command == "memory":
            if rest:
                raise ConfigError(f"Unexpected arguments for memory: {rest}")
            return cmd_memory(args)
        if args.command == "train":
            return cmd_train(args, rest)
        if args.command == "gotchas":
            from smolfsdp.book.gotchas import main as gotchas_main

            flags = ["--list"] * args.list + ["--json"] * args.json
            flags += ["--run", args.run] * bool(args.run) + ["--out", args.out] * bool(args.out)
            return gotchas_main(flags + rest)
        if args.command == "bench":
            return cmd_bench(args, rest)
        if args.command == "analyze-trace":
            if rest:
                raise ConfigError(f"Unexpected arguments for analyze-trace: {rest}")
            return cmd_analyze_trace(args)
        if args.command == "convert":
            from smolfsdp.checkpoint.dcp import convert_checkpoint

            print(convert_plan(args.checkpoint), flush=True)
            out = convert_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
            print(f"[smolfsdp] wrote {out}")
            return 0
    except ConfigError as err:
        print(f"smolfsdp: error: {err}", file=sys.stderr)
        return 2
    except (
        KeyboardInterrupt
    ) as err:  # Ctrl-C, or SIGTERM (smolfsdp.launch.torchrun.Terminated) to the launcher
        how = str(err) or "interrupted"
        print(
            f"smolfsdp: {how}; the ranks were asked to stop (checkpoints already complete are kept)",
            file=sys.stderr,
        )
        return 143 if type(err).__name__ == "Terminated" else 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
