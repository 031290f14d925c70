"""``smolfsdp memory``: the per-GPU memory estimate, the fit verdict and the recommendation.

    smolfsdp memory --model smollm3-3b --gpus 2 --strategy FULL_SHARD --seq-len 4096 [--json]
    smolfsdp memory --model smollm3-3b --gpus 8 --activation-checkpointing --ac-mode layer --ac-every 2
    smolfsdp memory --model smollm3-3b --gpus 2 --seq-len 4096 --engine trl   # TRL's loss and fused AdamW
    smolfsdp memory --config configs/runs/smollm3_3b_medical.yaml               # a run recipe's settings
    smolfsdp memory --config configs/runs/smollm3_3b_medical.yaml --gpu "A100 80GB"   # checkpointing by card
    smolfsdp memory --config configs/runs/smollm3_3b_medical.yaml --gpu "H100 SXM"  # + step time, epoch hours

Light at import (the parser answers a misspelt option before torch loads).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from smolfsdp.cli_output import format_fit_verdict
from smolfsdp.estimate.adamw_step import ADAMW_IMPLS, engine_optimizer  # light (torch only when called)
from smolfsdp.estimate.hardware import GPUS  # light (no torch): the parser lists the names
from smolfsdp.estimate.loss_path import LOSS_PATHS, engine_loss_path  # light (no torch)
from smolfsdp.estimate.recipes import RECIPES  # light (no torch)
from smolfsdp.lora_options import LORA_LAYOUTS


def cmd_memory(args: argparse.Namespace) -> int:
    """Print the per-rank memory estimate, the verdict for the chosen GPU, or JSON with ``--json``."""
    from smolfsdp.estimate.hardware import fit_verdict, get_gpu  # light: checked before torch loads

    check_memory_args(args)
    # --gpu-memory-gib alone describes a custom GPU; without either, the H100 SXM is the default
    gpu = get_gpu(args.gpu or (None if args.gpu_memory_gib is not None else "H100 SXM"), args.gpu_memory_gib)
    print(
        "[memory] reading the model's config (transformers loads torch: a few seconds)",
        file=sys.stderr,
        flush=True,
    )
    from smolfsdp.estimate.ac_choice import choose_checkpointing  # deferred with the estimator
    from smolfsdp.estimate.memory import estimate_memory, format_table  # deferred: transformers configs
    from smolfsdp.estimate.recommend import recommend  # deferred with hardware
    from smolfsdp.estimate.reserved import format_reserved  # deferred with hardware
    from smolfsdp.models.modeling import refuse_remote_code  # deferred: torch

    refuse_remote_code(args.model, option=None)  # memory has no --trust_remote_code: the advice says so

    common = memory_settings(args)  # checked in estimate_memory
    model, world, strategy, offload = (common.pop(k) for k in ("model", "world_size", "strategy", "offload"))
    est = estimate_memory(model, world_size=world, strategy=strategy, offload=offload, **common)
    rec = recommend(model, gpu, world, **common)
    fit = fit_verdict(est, gpu)  # the one verdict: fits / tight / does not fit, with its numbers
    settings = {"model": model, "world_size": world, "strategy": strategy, "offload": offload, **common}
    ac = choose_checkpointing(settings, gpu, memory_engine(args))  # the least checkpointing that fits
    plan, why = time_plan(args, gpu)
    if args.json:
        out = {
            "estimate": est.to_dict(),
            "gpu": {"name": gpu.name, "memory_bytes": gpu.memory_bytes},
            "verdict": fit.to_dict(),
            "fits": fit.fits,
            "recommendation": {
                "decision": rec.decision, "gpus": rec.gpus, "reason": rec.reason, "verdict": rec.fit.to_dict()
            },
            "checkpointing": ac.to_dict(),
            "time": plan.to_dict() if plan else {"not_estimated": why},
        }  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    table = format_table(est)
    print(table)
    width = len(table.splitlines()[2]) - len("  ") - 10 - len(" GiB")  # format_table's label column
    print(format_reserved(est, width))
    print(f"\nverdict on {gpu.name}: {fit.line}")
    print(format_fit_verdict(est, fit, rec))
    print(ac.text)
    print("\n" + "\n".join(plan.lines()) if plan else f"\ntime: not estimated ({why})")
    if plan and plan.step.get("mfu") and est.activation_checkpointing:
        print(measured_checkpointing_line())
    return 0


def measured_checkpointing_line() -> str:
    """What one H200 measured of activation checkpointing's cost (``book.measured_throughput``), beside the
    estimate's recompute FLOPs, or that it was not measured."""
    from smolfsdp.book.measured_throughput import measured_facts  # deferred: reads data/results/h200/

    f = measured_facts()
    if f is None:
        return (
            "measured: checkpointing's time cost has not been measured on a GPU (scripts/gpu_throughput.py)"
        )
    lo, hi = f["ac_cost_spread"]
    return (
        f"measured ({f['device']}, one process, no FSDP, {f['date']}): checkpointing every decoder layer took "
        f"{f['ac_cost']:.2f}x the time of none ({lo:.2f}-{hi:.2f}x), more than the FLOPs it recomputes: with it on, "
        "these step times are likely optimistic (data/results/h200/gpu_throughput.json)"
    )


def memory_engine(args: argparse.Namespace) -> str:
    """The engine ``smolfsdp memory`` estimates for: ``--engine``, else the recipe's (``--config``), else native."""
    if args.engine or not args.config:
        return args.engine or "native"
    from smolfsdp.config import load_config  # deferred with the estimator: a light parser

    return load_config(args.config).engine


#: ``smolfsdp memory``'s options and the ``TrainConfig`` field each overrides in the recipe's time plan
TIME_FIELDS = {
    "gpus": "nproc", "strategy": "sharding_strategy", "seq_len": "max_length",
    "micro_batch": "per_device_train_batch_size", "activation_checkpointing": "activation_checkpointing",
    "ac_mode": "ac_mode", "ac_every": "ac_every", "fsdp_version": "fsdp_version",
}  # fmt: skip


def time_plan(args: argparse.Namespace, gpu):
    """(``estimate.time_model.plan_time`` for ``--config``'s recipe on ``gpu`` with the options given over it,
    None) or (None, why not): no ``--config`` (the epoch needs a run's data and batch), a GPU without a bf16 peak."""
    if not args.config:
        return None, "give --config, a run recipe, for step time, tokens/s, MFU and epoch hours"
    if math.isnan(gpu.bf16_dense_tflops):
        return None, f"{gpu.name} has no bf16 peak TFLOP/s; give --gpu with one of {', '.join(GPUS)}"
    from smolfsdp.config import load_config  # deferred with the estimator: a light parser
    from smolfsdp.estimate.time_model import plan_time  # deferred: the step model

    given = {TIME_FIELDS[k]: v for k, v in given_options(args).items() if k in TIME_FIELDS}
    return plan_time(load_config(args.config, **given), gpu.name), None


#: ``smolfsdp memory``'s options and the ``estimate_memory`` keyword each sets (``lora*``: :func:`lora_spec`)
OPTION_SETTINGS = {
    "model": "model", "gpus": "world_size", "strategy": "strategy", "recipe": "recipe", "seq_len": "seq_len",
    "micro_batch": "micro_batch", "lora_layout": "lora_layout", "offload": "offload",
    "activation_checkpointing": "activation_checkpointing", "ac_mode": "ac_mode", "ac_every": "ac_every",
    "fsdp_version": "fsdp_version", "gpus_per_node": "gpus_per_node", "loss_path": "loss_path", "adamw": "adamw",
}  # fmt: skip


def memory_settings(args: argparse.Namespace) -> dict:
    """``estimate_memory`` keywords (``model`` and ``world_size`` included) for ``smolfsdp memory``'s options.

    With ``--config``: the run recipe's settings (``smolfsdp.estimate.recipe_peak.recipe_settings``, as every page
    quotes the recipe's peak), then every option given on the command line over them. ``--loss-path`` and
    ``--adamw`` default to the engine's (``--engine``, else the recipe's): ``loss_path.engine_loss_path``,
    ``adamw_step.engine_optimizer`` (on a GPU). Raises ConfigError for a recipe that does not load."""
    from smolfsdp.config import load_config  # deferred with the estimator: a light parser
    from smolfsdp.estimate.recipe_peak import recipe_settings  # deferred: transformers configs

    given = given_options(args)
    if args.config:
        cfg = load_config(args.config)
        settings, engine = recipe_settings(cfg), given.get("engine", cfg.engine)
    else:
        settings, engine = (
            {OPTION_SETTINGS[k]: _DEFAULTS[k] for k in OPTION_SETTINGS},
            args.engine or "native",
        )
    settings.update(loss_path=engine_loss_path(engine), adamw=engine_optimizer(engine))
    settings.update({OPTION_SETTINGS[k]: v for k, v in given.items() if k in OPTION_SETTINGS})
    if not args.config or any(k.startswith("lora") and k != "lora_layout" for k in given):
        settings["lora"] = lora_spec(args)
    settings.setdefault("gpus_per_node", max(_DEFAULTS["gpus_per_node"], settings["world_size"]))
    return settings


def check_memory_args(args: argparse.Namespace) -> None:
    """Refuse, before torch loads, what the estimate would otherwise drop or misread: ``--lora-layout
    adapter-units`` without LoRA or with FSDP2 (it models FSDP1's units only), and a ``--model`` that looks like a
    folder and is none (it would be looked up on the hub). Raises ConfigError naming the option and the fix."""
    from smolfsdp.errors import ConfigError  # deferred with the other smolfsdp modules: a light parser
    from smolfsdp.paths import check_model_folder  # light

    check_model_folder(args.model, "--model")
    if args.lora_layout != "adapter-units" or getattr(args, "config", None):
        return  # with --config the recipe's own checks (TrainConfig) hold its LoRA layout to its LoRA and FSDP version
    if not args.lora and all(v is None for v in (args.lora_rank, args.lora_alpha, args.lora_targets)):
        raise ConfigError(
            "--lora-layout adapter-units makes each LoRA adapter its own FSDP1 unit, and without --lora there are "
            "no adapters; add --lora, or drop --lora-layout."
        )
    if args.fsdp_version != 1:
        raise ConfigError(
            "--lora-layout adapter-units is an FSDP1 layout (FSDP2 shards each parameter as its own DTensor, so "
            "frozen weights never get a gradient); give --fsdp-version 1, or drop --lora-layout."
        )


def lora_spec(args: argparse.Namespace):
    """A ``LoraSpec`` from ``--lora`` / ``--lora-rank`` / ``--lora-alpha`` / ``--lora-targets`` (any of them
    turns LoRA on), else None. Raises ConfigError for a rank or alpha below 1 or an empty target list."""
    from smolfsdp.errors import ConfigError  # deferred with the other smolfsdp modules: a light parser
    from smolfsdp.estimate.params import LoraSpec  # deferred: transformers configs

    given = [args.lora_rank, args.lora_alpha, args.lora_targets]
    if not args.lora and all(v is None for v in given):
        return None
    r = 8 if args.lora_rank is None else args.lora_rank
    alpha = 16 if args.lora_alpha is None else args.lora_alpha
    if min(r, alpha) < 1:
        raise ConfigError(
            "--lora-rank and --lora-alpha must be at least 1 (e.g. --lora-rank 64 --lora-alpha 16)."
        )
    names = "q_proj,k_proj,v_proj,o_proj" if args.lora_targets is None else args.lora_targets
    targets = tuple(t.strip() for t in names.split(",") if t.strip())
    if not targets:
        raise ConfigError("--lora-targets is empty; give module names, e.g. q_proj,k_proj,v_proj,o_proj.")
    known = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    if unknown := [t for t in targets if t not in known]:
        raise ConfigError(
            f"--lora-targets: unknown module(s) {', '.join(unknown)}; known: {', '.join(known)}."
        )
    return LoraSpec(r=r, alpha=alpha, targets=targets)


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" only where there is a default to state: not after an unset option's None or a
    flag's False (the help text says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_memory_parser(sub: argparse._SubParsersAction, common: dict) -> None:
    fmt = {**common, "formatter_class": _DefaultsHelp}
    p = sub.add_parser("memory", help="per-GPU memory estimate, fit verdict and recommendation", **fmt)
    p.add_argument(
        "--model", default="smollm3-3b", help="smollm3-3b, tiny, a dir with config.json, or a hub id"
    )
    p.add_argument("--gpus", type=int, default=1, help="world size")
    p.add_argument(
        "--strategy", default="FULL_SHARD", help="NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD"
    )
    p.add_argument(
        "--recipe", default="hf-fsdp-bf16", choices=list(RECIPES),
        help="precision recipe: bytes per parameter of weights, gradients, master copy, optimizer state "
        "(smolfsdp.estimate.recipes.RECIPES)",
    )  # fmt: skip
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per row")
    p.add_argument("--micro-batch", type=int, default=1, help="rows per rank per step")
    p.add_argument("--lora", action="store_true", help="LoRA (r=8, alpha 16 on q/k/v/o unless set below)")
    p.add_argument("--lora-rank", type=int, default=None, help="LoRA rank r (implies --lora)")
    p.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (implies --lora)")
    p.add_argument(
        "--lora-targets", default=None, help="comma-separated modules, e.g. q_proj,k_proj,v_proj,gate_proj"
    )
    p.add_argument(
        "--lora-layout", default="in-unit", choices=list(LORA_LAYOUTS),
        help="FSDP1 + LoRA: adapters inside the layer's unit (smolfsdp) or their own units (fsdp_qlora)",
    )  # fmt: skip
    p.add_argument("--offload", action="store_true", help="CPU offload of params, grads, optimizer state")
    p.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute activations in backward"
    )
    p.add_argument(
        "--ac-mode", default="full", choices=["full", "layer", "op"],
        help="with --activation-checkpointing: every layer, every --ac-every-th layer, or op-level selective",
    )  # fmt: skip
    p.add_argument("--ac-every", type=int, default=None, help="--ac-mode layer: checkpoint every k-th layer")
    p.add_argument(
        "--config", default=None, metavar="YAML",
        help="a run recipe (configs/runs/): estimate at its settings, as the book quotes its peak; the options "
        "given here override them",
    )  # fmt: skip
    p.add_argument(
        "--engine", default=None, choices=["native", "trl"],
        help="the engine whose loss and AdamW step are estimated unless --loss-path / --adamw say otherwise: "
        "native (transformers' loss, foreach AdamW on a GPU; the default) or trl (TRL's fused LM head, fused "
        "AdamW); with --config, the recipe's engine unless given",
    )  # fmt: skip
    p.add_argument(
        "--loss-path", default=None, choices=list(LOSS_PATHS),
        help="the code computing the loss (default: the engine's): transformers' (logits held; the native "
        "engine) or TRL's fused LM head (no logits; TRL 1.16's SFTTrainer, the TRL engine); torchtitan's two loops",
    )  # fmt: skip
    p.add_argument(
        "--adamw", default=None, choices=list(ADAMW_IMPLS),
        help="the AdamW step (default: the engine's on a GPU): fused (the Trainer's adamw_torch_fused; no "
        "temporary), foreach (torch's choice on CUDA; a v-sized temporary), for-loop (torch's on CPU)",
    )  # fmt: skip
    p.add_argument("--fsdp-version", type=int, default=1, help="1 (the README's Trainer run) or 2")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (HYBRID_SHARD groups)")
    p.add_argument(
        "--gpu", default=None,
        help=f"the GPU to fit on: {', '.join(GPUS)} (H100 SXM unless --gpu-memory-gib describes another)",
    )  # fmt: skip
    p.add_argument("--gpu-memory-gib", type=float, default=None, help="a GPU not in the table, by memory")
    p.add_argument("--json", action="store_true", help="the estimate and verdict as JSON")
    for action in p._actions:  # every value option records that it was typed (argparse keeps no such record)
        if type(action) is argparse._StoreAction:
            action.__class__ = _Typed


class _Typed(argparse._StoreAction):
    """A value option that also adds its name to ``namespace.typed``, so an option typed with its default value
    (``--micro-batch 1`` over a recipe of 2) still overrides the recipe (:func:`given_options`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.typed = {*getattr(namespace, "typed", ()), self.dest}


def given_options(args: argparse.Namespace) -> dict:
    """The options given on the command line: typed, or set to other than their default."""
    typed = getattr(args, "typed", ())
    return {k: v for k, v in vars(args).items() if k in _DEFAULTS and (k in typed or v != _DEFAULTS[k])}


def _parser_defaults() -> dict:
    """Each ``smolfsdp memory`` option's default (what :func:`memory_settings` reads as "not given")."""
    ap = argparse.ArgumentParser()
    add_memory_parser(ap.add_subparsers(dest="command"), {})
    return vars(ap.parse_args(["memory"]))


_DEFAULTS = _parser_defaults()
