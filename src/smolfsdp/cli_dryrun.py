"""``smolfsdp dryrun``: a run config at full size on fake tensors (``smolfsdp.audit.dryrun``), as a table or JSON.

    smolfsdp dryrun --config configs/runs/smollm3_3b_medical.yaml [--gpus 4] [--<field> VALUE ...] [--json]

Light at import (the parser answers a misspelt option before torch loads); the run imports torch itself.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from smolfsdp.cli_args import field_parser, overrides_from
from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.paths import repo_root

GIB = 2**30


def add_dryrun_parser(sub: argparse._SubParsersAction, common: dict) -> None:
    p = sub.add_parser(
        "dryrun",
        parents=[field_parser()],
        help="a run config at full size on fake tensors: memory by moment, collectives, FLOPs (no GPU)",
        usage="smolfsdp dryrun [--config YAML] [--gpus N] [--<field> VALUE ...] [--json]",
        description="One optimizer step of the config's real model and sharding code on fake tensors and a "
        "fake process group, rank 0's view: traced, not measured on a GPU.",
        **common,
    )
    p.add_argument("--config", default=None, metavar="YAML", help="a run recipe; options override it")
    p.add_argument("--gpus", type=int, default=None, help="world size of the fake group (default: nproc)")
    p.add_argument("--json", action="store_true", help="the report as JSON (progress goes to stderr)")
    p.add_argument(
        "--gpu", default=None, metavar="NAME",
        help="also say whether the step fits that GPU (the replayed allocator at its memory; names as in "
        "`smolfsdp memory --gpu`)",
    )  # fmt: skip
    p.add_argument("--gpu-memory-gib", type=float, default=None, help="a GPU not in the table, by memory")


def cmd_dryrun(args: argparse.Namespace) -> int:
    """Run the dry run, print the report and the estimator beside it."""
    if args.gpus is not None and args.gpus < 1:  # before torch loads
        raise ConfigError(f"--gpus {args.gpus}: the fake group needs at least 1 rank; give --gpus 1 or more.")
    cfg = load_config(args.config, **overrides_from(args))
    from smolfsdp.estimate.hardware import get_gpu  # deferred: measure loads torch

    # an unknown name fails here, before the dry run
    gpu = get_gpu(args.gpu, args.gpu_memory_gib) if args.gpu or args.gpu_memory_gib is not None else None
    from smolfsdp.audit.dryrun.compare import compare_with_estimate  # deferred: torch, transformers
    from smolfsdp.audit.dryrun.dry_run import dry_run  # deferred: torch, transformers

    out = sys.stderr if args.json else sys.stdout
    report = dry_run(cfg, args.gpus, progress=lambda msg: print(f"[dryrun] {msg}", file=out, flush=True))
    table = compare_with_estimate(report, cfg)
    replayed = _replayed(report, None)  # once, for the text or JSON and the verdict
    if args.json:
        fit = fit_on_gpu(report, gpu, replayed) if gpu else None
        print(json.dumps({**report.to_dict(), "estimate_vs_dry_run": table.to_dict("records"),
                          "allocator_replay": replayed, "fit": fit}, indent=1))  # fmt: skip
        return 0
    print(format_dryrun(report, table, gpu, replayed))
    return 0


def _allowance_line(setup: dict) -> str:
    """The settings the traced peak was computed at (``smolfsdp.estimate.recipe_peak.settings_line``, the line every
    chapter prints beside the same number), what it leaves out (fake tensors have no CUDA context or NCCL buffers)
    and what ``smolfsdp memory``'s device peak adds for them, so the two numbers are not read as one."""
    from smolfsdp.estimate.memory import (
        COMM_BUFFER_BYTES,
        CUDA_CONTEXT_BYTES,
    )  # deferred: measure loads torch
    from smolfsdp.estimate.recipe_peak import (  # deferred: measure loads torch
        settings_from_setup,
        settings_line,
    )

    extra = CUDA_CONTEXT_BYTES + (COMM_BUFFER_BYTES if setup["world_size"] > 1 else 0)
    return (
        f"(settings: {settings_line(settings_from_setup(setup), 'tensors')}; a GPU adds the CUDA context and NCCL "
        f"buffers, {extra / GIB:.2f} GiB in `smolfsdp memory`'s device peak)"
    )


def _record_stream_lines(setup: dict) -> list[str]:
    """FSDP1 only: the blocks ``record_stream`` keeps active on a GPU that fake tensors cannot trace."""
    held = setup.get("fsdp1_record_stream_bytes")
    if not held or not sum(held.values()):
        return []
    parts = ", ".join(f"{k} {v / GIB:.3f} GiB" for k, v in held.items())
    return [
        f"(FSDP1 on a GPU also keeps active, not allocated: {parts}; not traced, record_stream is a no-op here)"
    ]


def _replayed(report, replayed):
    """``replayed`` or, for a report that has an allocation order and no offload, its replay; None otherwise (a
    report read back from JSON carries no allocation order; with offload the trace holds the host's tensors)."""
    from smolfsdp.audit.allocator_replay import replay  # no torch

    if replayed is not None or getattr(report, "offload", None) or not getattr(report, "alloc_events", None):
        return replayed
    return replay(report.alloc_events)


def _held_to_published() -> str:
    """How far the replay was from the published runs of ``check.json``'s ``dry_run`` rows, in words; without
    that file (a copy without ``data/results``, or one being rewritten) a sentence saying so, not an error."""
    from smolfsdp.audit import published_rows  # deferred: measure loads torch

    path = repo_root() / published_rows.CHECK_PATH
    try:
        rows = json.loads(path.read_text()).get("dry_run", [])
    except FileNotFoundError:
        return (
            f"not yet held to published runs: {path} is absent (python scripts/published_check.py writes it)"
        )
    except (OSError, ValueError, AttributeError) as err:
        return f"not held to published runs: {path} is not readable JSON ({err})"
    worst = max((abs(r["reserved"]["error_pct"]) for r in rows), default=None)
    if worst is None:
        return "not yet held to published runs (scripts/published_check.py writes the check)"
    return (
        f"held to {len(rows)} published torchtitan runs within {math.ceil(worst)} % "
        f"({published_rows.CHECK_PATH}, dry_run)"
    )


def _replay_lines(report, replayed=None) -> list[str]:
    """The caching allocator replayed on the step's allocation order (``smolfsdp.audit.allocator_replay.replay``):
    reserved memory on a GPU. Not with CPU offload (the trace holds the host's tensors too)."""
    from smolfsdp.audit.allocator_replay import REPLAY_STEPS  # no torch
    from smolfsdp.estimate.reserved import CUBLAS_WORKSPACE_BYTES  # no torch; deferred as the module's others

    if getattr(report, "offload", None):
        return ["(the allocator replay is left out with CPU offload: the trace cannot tell host from device)"]
    out = _replayed(report, replayed)
    if out is None:
        return []
    reserved = out["peak_reserved"] + CUBLAS_WORKSPACE_BYTES
    return [
        f"on a real GPU ~{reserved / GIB:,.2f} GiB reserved ({reserved / report.peak_bytes:.2f} x the tensors; "
        f"{out['peak_active'] / GIB:,.2f} GiB active: allocated or held by record_stream): PyTorch's caching allocator "
        f"replayed on this step's allocation order (smolfsdp.audit.allocator_replay: {REPLAY_STEPS} steps, AdamW's state "
        f"made in the first, a pool per stream, FSDP1's record_stream; + {CUBLAS_WORKSPACE_BYTES >> 20} MiB cuBLAS "
        f"workspace); {_held_to_published()}"
    ]


def fit_on_gpu(report, gpu, replayed=None) -> dict:
    """Whether the traced step fits ``gpu``: the allocation order replayed with the card's memory as the
    allocator's capacity, less the CUDA context, NCCL's buffers (``smolfsdp.estimate.memory``'s constants) and the
    cuBLAS workspace. ``fits``: no segment had to be given back; ``tight``: the allocator had to release its
    cache and retry (``num_alloc_retries``: slower, and fragmentation can still fail it later); ``does not fit``:
    out of memory even after that. With CPU offload: ``None`` verdict (the trace cannot tell host from device).
    ``replayed``: the replay without a capacity, when already made: within the card, the capped replay is that
    same run, so it is not run again."""
    from smolfsdp.audit.allocator_replay import OutOfMemory, replay  # no torch
    from smolfsdp.estimate.memory import (
        COMM_BUFFER_BYTES,
        CUDA_CONTEXT_BYTES,
    )  # deferred: measure loads torch
    from smolfsdp.estimate.reserved import CUBLAS_WORKSPACE_BYTES  # no torch

    outside = (
        CUDA_CONTEXT_BYTES
        + CUBLAS_WORKSPACE_BYTES
        + (COMM_BUFFER_BYTES if report.setup["world_size"] > 1 else 0)
    )
    rec = {"gpu": gpu.name, "memory_gib": gpu.memory_bytes / GIB, "outside_allocator_gib": outside / GIB}
    if report.offload or not report.alloc_events:
        return {**rec, "verdict": None}
    capacity = gpu.memory_bytes - outside
    out = _replayed(report, replayed)
    try:
        if out["peak_reserved"] > capacity:  # the cache would be released somewhere: replay at the capacity
            out = replay(report.alloc_events, capacity_bytes=capacity)
    except OutOfMemory:
        return {**rec, "verdict": "does not fit"}
    return {**rec, "verdict": "tight" if out["retries"] else "fits", "retries": out["retries"],
            "peak_reserved_gib": (out["peak_reserved"] + CUBLAS_WORKSPACE_BYTES) / GIB}  # fmt: skip


def _fit_line(report, gpu, replayed=None) -> list[str]:
    fit = fit_on_gpu(report, gpu, replayed)
    if fit["verdict"] is None:
        return [f"(no verdict on {gpu.name}: with CPU offload the trace cannot tell host from device memory)"]
    retried = (
        f"; the allocator released its cache and retried {fit['retries']} time(s)"
        if fit.get("retries")
        else ""
    )
    return [
        f"on {gpu.name} ({fit['memory_gib']:.1f} GiB): {fit['verdict']}, by the allocator replayed at that "
        f"capacity less {fit['outside_allocator_gib']:.2f} GiB of CUDA context, NCCL buffers and cuBLAS "
        f"workspace{retried}"
    ]


def _moment_text(moment: dict) -> str:
    """A traced moment in the estimator's words: ``the loss moment (backward has just started; traced in M)``."""
    from smolfsdp.estimate.recipe_peak import moment_words, traced_moment  # deferred: measure loads torch

    words = moment_words(traced_moment(moment))
    module = moment.get("module", "?")
    return words[:-1] + f"; traced in {module})" if words.endswith(")") else f"{words} (traced in {module})"


def format_dryrun(report, table, gpu=None, replayed=None) -> str:
    """The report for people: the setup, the peak and its moment, collectives, FLOPs, the estimate beside it."""
    s = report.setup
    lines = [
        f"{s['model']}: {s['engine']} engine, FSDP{s['fsdp_version']} {s['sharding_strategy']} over {s['world_size']} "
        f"ranks (fake), {s['gradient_accumulation_steps']} x {s['per_device_train_batch_size']} x {s['max_length']} "
        f"tokens per step, mixed precision {s['mixed_precision']}, activation checkpointing "
        f"{_ac_words(s) if s['activation_checkpointing'] else 'off'}{_lora_words(s)}",
        f"({report.label})",
        "",
        f"peak {report.peak_bytes / GIB:,.2f} GiB on rank 0, at {_moment_text(report.peak_moment)}; at that moment:",
    ]
    lines += [f"  {k:<16} {v / GIB:10.3f} GiB" for k, v in report.peak_by_category.items()]
    lines += [_allowance_line(s)]
    lines += _record_stream_lines(s)
    replayed = _replayed(report, replayed)
    lines += _replay_lines(report, replayed)
    lines += _fit_line(report, gpu, replayed) if gpu else []
    if report.offload:  # parameter shards, gradients and optimizer state on the host: the device peaks apart
        o, m = report.offload, report.offload["device_peak_moment"]
        lines += [
            f"CPU offload: the host holds {o['host_bytes'] / GIB:,.2f} GiB after the step; the device's own peak is "
            f"{o['device_peak_bytes'] / GIB:,.2f} GiB, at {_moment_text(m)}"
        ]
    lines += ["", "collectives per step (rank 0): phase, kind, count, bytes"]
    lines += [
        f"  {c['phase']:<10} {c['kind']:<15} {c['count']:>5} {c['bytes'] / GIB:10.3f} GiB"
        for c in report.collectives
    ]
    ratio = report.flops_counted / report.flops_formula if report.flops_formula else float("nan")
    lines += [
        "",
        f"FLOPs per step: counted {report.flops_counted:.4g} (recompute included), the MFU formula "
        f"6N + 12·L·H·Q·T gives {report.flops_formula:.4g} (counted / formula {ratio:.3f})",
        _flops_ratio_words(s),
        "",
        "estimate (smolfsdp memory) beside the dry run, GiB:",
        table.to_string(index=False, float_format=lambda x: f"{x:,.3f}"),
        "",
        f"took {report.seconds:.0f} s",
    ]
    return "\n".join(lines)


def _flops_ratio_words(setup: dict) -> str:
    """Why counted / formula is not 1. The formula is MFU's model FLOPs (PaLM, Chowdhery et al. 2022, app. B:
    6N per token, 4N for a frozen base, no recompute); the count is every matmul the step ran."""
    why = []
    if setup.get("activation_checkpointing"):
        why.append(
            "the forward recomputed in backward under activation checkpointing (most of a forward: torch stops before each layer's last matmul; smolfsdp.estimate.recompute)"
        )
    if (
        setup.get("lora")
        and setup.get("fsdp_version") == 1
        and setup.get("lora_layout", "in-unit") == "in-unit"
    ):
        why.append(
            "the frozen base's weight gradients: FSDP1 keeps the adapters in the layer's FlatParameter, which "
            "requires grad, so autograd computes them too"
        )
    if not why:
        return "  (no recompute: the count and the formula differ only where the formula approximates)"
    return "  (the count includes " + "; and ".join(why) + "; MFU counts only the formula's FLOPs)"


def _lora_words(setup: dict) -> str:
    """``, LoRA`` and, for FSDP1, where the adapters sit (``smolfsdp.lora_options``); empty without LoRA."""
    if not setup["lora"]:
        return ""
    layout = setup.get("lora_layout")  # FSDP1 reports only; older reports: in-unit
    return ", LoRA (each adapter its own FSDP unit)" if layout == "adapter-units" else ", LoRA"


def _ac_words(setup: dict) -> str:
    """``on`` (every layer), ``on, one layer in k`` or ``on, op-level selective`` (``smolfsdp.ac_options``)."""
    mode = setup.get("ac_mode", "full")  # reports written before ac_mode existed: full
    return {"layer": f"on, one layer in {setup.get('ac_every')}", "op": "on, op-level selective"}.get(
        mode, "on"
    )
