"""``smolfsdp`` command line.

    smolfsdp train [--config configs/runs/smoke.yaml] [--<field> <value> ...]
    smolfsdp memory --model smollm3-3b --gpus 2 --strategy FULL_SHARD --seq-len 4096 [--json]

Any ``TrainConfig`` field can be overridden (``--max_steps 20`` or ``--max-steps=20``). Outside
torchrun/accelerate the command checks the configuration, then starts ``nproc`` processes itself;
inside them (``RANK`` set) it trains.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from smolfsdp.config import ConfigError, load_config


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
    from smolfsdp.distributed import is_launched

    cfg = load_config(args.config, **parse_overrides(rest))
    if is_launched():
        from smolfsdp.sft import train

        train(cfg)
        return 0
    from smolfsdp.launch import launch
    from smolfsdp.sft import preflight

    found = preflight(cfg)
    print(
        f"[smolfsdp] {cfg.name}: engine={cfg.engine} fsdp_version={cfg.fsdp_version} nproc={cfg.nproc} "
        f"model={cfg.model} wrap={found['wrap_class']} data={found['data']}",
        flush=True,
    )
    proc = launch(cfg)
    if proc.returncode == 0:
        print(f"[smolfsdp] run folder: {cfg.run_dir}", flush=True)
    return proc.returncode


def cmd_memory(args: argparse.Namespace) -> int:
    """Print the per-rank memory estimate, the verdict for the chosen GPU, or JSON with ``--json``."""
    import json

    from smolfsdp.hardware import fits, get_gpu, recommend
    from smolfsdp.memory import format_table

    gpu = get_gpu(args.gpu, args.gpu_memory_gib)
    common = {
        "recipe": args.recipe,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "lora": args.lora,
        "activation_checkpointing": args.activation_checkpointing,
        "fsdp_version": args.fsdp_version,
        "gpus_per_node": args.gpus_per_node,
    }
    from smolfsdp.memory import estimate_memory

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="smolfsdp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="fine-tune (launches nproc processes unless already launched)")
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
        "--recipe", default="hf-fsdp-bf16", help="precision recipe (see smolfsdp.memory.RECIPES)"
    )
    p_mem.add_argument("--seq-len", type=int, default=2048)
    p_mem.add_argument("--micro-batch", type=int, default=1)
    p_mem.add_argument("--lora", action="store_true", help="LoRA r=8 on q/k/v/o")
    p_mem.add_argument("--offload", action="store_true", help="CPU offload of params, grads, optimizer state")
    p_mem.add_argument("--activation-checkpointing", action="store_true")
    p_mem.add_argument("--fsdp-version", type=int, default=2)
    p_mem.add_argument("--gpus-per-node", type=int, default=8)
    p_mem.add_argument("--gpu", default="H100 SXM", help="a GPU from smolfsdp.hardware.GPUS")
    p_mem.add_argument("--gpu-memory-gib", type=float, default=None, help="a GPU not in the table, by memory")
    p_mem.add_argument("--json", action="store_true")
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "memory":
            if rest:
                raise ConfigError(f"Unexpected arguments for memory: {rest}")
            return cmd_memory(args)
        if args.command == "train":
            return cmd_train(args, rest)
    except ConfigError as err:
        print(f"smolfsdp: error: {err}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
