"""Reader-shaped views of the scaling projections, on the book's own full recipe.

Used by the chapter "Scaling out" (notebooks/07_scaling.ipynb). ``smolfsdp.estimate.scaling.scaling_table``
computes the projections; this module picks the recipe (sequence, micro-batch, gradient accumulation,
FSDP version, activation checkpointing from ``configs/runs/smollm3_3b_medical.yaml``), turns the frames
into tables a reader can scan (units, percentages, "from 8 GPUs" instead of ``8.0``/``NaN``), sweeps the
tokens per step, and writes the verdict sentences from the numbers.

    python -c "from smolfsdp.book.scaling_views import book_assumptions; print(book_assumptions())"
"""

from __future__ import annotations

import pandas as pd

from smolfsdp.config import load_config
from smolfsdp.estimate.adamw_step import ADAMW_WORDS, engine_optimizer
from smolfsdp.estimate.calibration import hfu_calibration, run_mfu
from smolfsdp.estimate.hardware import fit_verdict, get_gpu
from smolfsdp.estimate.loss_path import engine_loss_path
from smolfsdp.estimate.memory import GIB, estimate_memory
from smolfsdp.estimate.scaling import estimate_step, mfu_text, scaling_table
from smolfsdp.estimate.time_model import duration, plan_time
from smolfsdp.paths import recipe

STRATEGY_NAMES = {
    "NO_SHARD": "NO_SHARD (DDP)",
    "SHARD_GRAD_OP": "SHARD_GRAD_OP (ZeRO-2)",
    "FULL_SHARD": "FULL_SHARD (ZeRO-3)",
    "HYBRID_SHARD": "HYBRID_SHARD (HSDP)",
}


def book_assumptions(
    recipe_name: str = "smollm3_3b_medical",
    *,
    gpu: str = "H100 SXM",
    gpus_per_node: int = 8,
    network: str = "InfiniBand NDR 400 Gb/s",
    mfu: float | None = None,
) -> dict:
    """``scaling_table`` arguments for the committed run recipe: its ``max_length`` as the sequence, its
    micro-batch, gradient accumulation, FSDP version, activation checkpointing, its engine's loss and AdamW step
    (``adamw_step.engine_optimizer``: what the engine builds on a GPU); the cluster is an
    assumption; the MFU (a fraction) the published calibration for ``gpu`` unless given
    (``smolfsdp.estimate.calibration.run_mfu``: the HFU of torchtitan's published rows, each with its recomputation
    counted, error % stated; the recipe's own checkpointing)."""
    cfg = load_config(recipe(recipe_name))
    mfu = mfu if mfu is not None else run_mfu(gpu, **recipe_run(cfg))["mfu"]
    return dict(
        gpu=gpu, gpus_per_node=gpus_per_node, network=network, mfu=mfu, seq_len=cfg.max_length,
        micro_batch=cfg.per_device_train_batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        fsdp_version=cfg.fsdp_version, activation_checkpointing=cfg.activation_checkpointing,
        loss_path=engine_loss_path(cfg.engine), adamw=engine_optimizer(cfg.engine),
    )  # fmt: skip


def recipe_run(cfg) -> dict:
    """``calibration.run_mfu``'s keywords after the GPU for a run config: its model, sequence and checkpointing."""
    model = "smollm3-3b" if cfg.model == "HuggingFaceTB/SmolLM3-3B" else cfg.model
    mode = cfg.ac_mode if cfg.activation_checkpointing else None
    return {"model": model, "seq_len": cfg.max_length, "ac_mode": mode, "ac_every": cfg.ac_every}


def assumptions_markdown(a: dict, recipe_name: str = "smollm3_3b_medical") -> str:
    tokens = a["seq_len"] * a["micro_batch"]
    return (
        f"From `configs/runs/{recipe_name}.yaml`: sequences of up to {a['seq_len']:,} tokens, micro-batch "
        f"{a['micro_batch']}, so **{tokens:,} tokens per GPU per micro-batch**, {a['gradient_accumulation_steps']} "
        f"micro-batches per optimizer step ({tokens * a['gradient_accumulation_steps']:,} tokens per GPU and step), "
        f"FSDP{a['fsdp_version']}, activation checkpointing {'on' if a['activation_checkpointing'] else 'off'}, "
        f"bf16 compute with fp32 gradient reduction, {ADAMW_WORDS[a.get('adamw', 'foreach')]}. Assumed: {a['gpu']}, {a['gpus_per_node']} per node, "
        f"{a['network']} between nodes, {mfu_short(a, recipe_run(load_config(recipe(recipe_name))))}; weak scaling "
        "(tokens per GPU fixed). DDP (NO_SHARD) "
        "all-reduces the gradients once per optimizer step, as accelerate's `accumulate()` and the Trainer run it "
        "by default under gradient accumulation (`no_sync()` on the other micro-batches); the FSDP strategies "
        "reduce after every micro-batch, as smolfsdp runs them (the Trainer's default would put FSDP under "
        "`no_sync()` too, holding unsharded gradients: below)."
    )


def mfu_short(a: dict, run: dict) -> str:
    """The MFU of :func:`book_assumptions` (``a``) as the chapter states it: the rate and where it comes from, the
    fit's errors left to the appendix that checks it (@sec-checks-hfu). ``run``: :func:`recipe_run`'s keywords.
    A given MFU (not the calibration's) is said to be given, as ``estimate.scaling.mfu_text`` says it."""
    cal = run_mfu(a["gpu"], **run)
    if a["mfu"] != cal["mfu"]:
        return mfu_text(a["mfu"], a["gpu"], run)
    fit = hfu_calibration(a["gpu"])
    rows = (
        f"the median of {fit['rows']} published {a['gpu']} rows"
        if fit["basis"] == a["gpu"]
        else f"the median of all {fit['rows']} published rows (none on {a['gpu']})"
    )
    return f"{cal['text'].removesuffix(' from the ' + fit['text'])} from HFU {100 * fit['hfu']:.1f} %, {rows} (@sec-checks-hfu)"


def ddp_sync_view(a: dict, model="smollm3-3b", n_gpus=(8, 16, 1024)) -> pd.DataFrame:
    """DDP's projected efficiency per GPU count with the gradient all-reduce once per optimizer step
    (``no_sync`` on all but the last micro-batch, accelerate's and the Trainer's default) and after every
    micro-batch (the cost of not
    using it), with the recipe's ``gradient_accumulation_steps`` (``a``: :func:`book_assumptions`).
    Columns hold the efficiency as a percentage and the all-reduced bytes per step in GiB."""
    acc = a["gradient_accumulation_steps"]
    kw = {k: a[k] for k in ("gpu", "gpus_per_node", "network", "mfu", "seq_len", "micro_batch")}
    rows = {}
    for n in n_gpus:
        row = {}
        for no_sync, label in ((True, "once per step (no_sync)"), (False, f"every micro-batch ({acc}x)")):
            step = estimate_step(model, strategy="NO_SHARD", n_gpus=n, gradient_accumulation_steps=acc,
                                 no_sync=no_sync, **kw)  # fmt: skip
            row[(label, "efficiency")] = _pct(step["efficiency"])
            row[(label, "all-reduced per step (GiB)")] = f"{step['logical_bytes'] / GIB:,.1f}"
        rows[f"{n:,}"] = row
    table = pd.DataFrame(rows).T.rename_axis("GPUs")
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["DDP gradient all-reduce", ""])
    return table


def ddp_sync_markdown(view: pd.DataFrame, a: dict) -> str:
    """The sentence under :func:`ddp_sync_view`: what syncing every micro-batch would cost DDP."""
    acc = a["gradient_accumulation_steps"]
    once = next(c for c in view.columns.levels[0] if c.startswith("once"))
    every = next(c for c in view.columns.levels[0] if c.startswith("every"))
    parts = [
        f"{gpus} GPUs: {r[(once, 'efficiency')]} against {r[(every, 'efficiency')]}"
        for gpus, r in view.iterrows()
    ]
    return (
        f"DDP as the Trainer runs it by default, all-reducing once per optimizer step, against an all-reduce "
        f"after each of the {acc} "
        f"micro-batches ({'; '.join(parts)}). Skipping the sync costs DDP no memory (every GPU holds whole "
        "gradients anyway), so `no_sync()` under accumulation is free; what still limits DDP across nodes is "
        "that the one all-reduce can hide only behind the backward of the last micro-batch."
    )


def _pct(x: float) -> str:
    return f"{x:.1%}"


def preview(scaling: pd.DataFrame, n_gpus=(2, 16, 1024)) -> pd.DataFrame:
    """A few rows of the projection with units: step time, communication, what stays exposed, memory (what the
    GPU must hold, reserved + CUDA context + NCCL, with the tensor peak in brackets) and the fit verdict's word
    on it (``hardware.fit_verdict``: fits, tight or does not fit on the assumed GPU)."""
    d = scaling[scaling["n_gpus"].isin(n_gpus)]
    return pd.DataFrame(
        {
            "model": d["model"],
            "strategy": d["strategy"].map(STRATEGY_NAMES),
            "GPUs": d["n_gpus"].map("{:,}".format),
            "compute per step (s)": d["compute_s"].map("{:,.2f}".format),
            "communication per step (s)": d["comm_s"].map("{:,.2f}".format),
            "step with overlap (s)": d["step_s"].map("{:,.2f}".format),
            "efficiency": d["efficiency"].map(_pct),
            "needed per GPU, GiB (tensor peak)": [
                f"{n:,.1f} ({p:,.1f})" for n, p in zip(d["need_gib"], d["memory_gib"], strict=True)
            ],
            "verdict": d["verdict"],
        }
    ).set_index(["model", "strategy", "GPUs"])


def recipe_time_view(recipe_name: str = "smollm3_3b_medical", gpus=("H100 SXM", "A100 80GB")) -> pd.DataFrame:
    """The recipe on its own ``nproc`` GPUs of each card, from the one time model
    (``smolfsdp.estimate.time_model.plan_time``, what ``smolfsdp memory --config`` prints and chapter 01 states):
    step time, tokens/s per GPU, the MFU, optimizer steps and hours of one epoch. One row per card."""
    cfg = load_config(recipe(recipe_name))
    plans = [plan_time(cfg, gpu) for gpu in gpus]
    return pd.DataFrame(
        {
            "GPUs": [f"{p.n_gpus} x {p.gpu}" for p in plans],
            "step (s)": [f"{p.step_s:.2f}" for p in plans],
            "tokens/s per GPU": [f"{p.tokens_per_s_per_gpu:,.0f}" for p in plans],
            "MFU": [f"{100 * p.mfu:.1f} %" for p in plans],
            "optimizer steps per epoch": [f"{p.steps_per_epoch:,}" for p in plans],
            "epoch": [duration(p.epoch_s) for p in plans],
        }
    ).set_index("GPUs")


def recipe_time_markdown(recipe_name: str = "smollm3_3b_medical", gpu: str = "H100 SXM") -> str:
    """The sentence under :func:`recipe_time_view`: the command that prints the same numbers, and their sources."""
    cfg = load_config(recipe(recipe_name))
    p = plan_time(cfg, gpu)
    return (
        f"Read a row across: the {gpu} row's step is the projection's {p.n_gpus}-GPU {cfg.sharding_strategy} step "
        f"above ({p.step_s:.2f} s), and an epoch is "
        f"{p.steps_per_epoch:,} of them ({p.epoch_rows:,} training rows, {p.rows_per_step} per step: {p.rows_source}). "
        f'`smolfsdp memory --config configs/runs/{recipe_name}.yaml --gpu "{gpu}"` prints the same numbers under '
        f"its memory verdict, and chapter 01 states them. Tokens: {p.token_text}. MFU: {p.mfu_source}."
    )


def efficiency_view(scaling: pd.DataFrame, n_gpus=(8, 16, 1024)) -> pd.DataFrame:
    """Efficiency (compute / step time with overlap) per model and GPU count, one column per strategy."""
    d = scaling[scaling["n_gpus"].isin(n_gpus)]
    table = d.pivot_table(index=["model", "n_gpus"], columns="strategy", values="efficiency")
    table = table.rename(columns=STRATEGY_NAMES).map(_pct)
    table.index = table.index.set_names(["model", "GPUs"])
    table.index = table.index.set_levels(table.index.levels[1].map("{:,}".format), level="GPUs")  # "1,024"
    return table


def fits_from_view(scaling: pd.DataFrame) -> pd.DataFrame:
    """The smallest GPU count at which each strategy's verdict is "fits" (``hardware.fit_verdict``, the
    ``verdict`` column), as words: "from 8 GPUs", "from 8 GPUs (tight at 4)" where fewer GPUs are tight (the
    tensors fit but not the reserved memory), "not up to 1,024 GPUs" (with "tight from N" where some are)."""
    top = int(scaling["n_gpus"].max())
    out = {}
    for (model, strategy), d in scaling.groupby(["model", "strategy"], sort=False):
        ok = d.loc[d["verdict"] == "fits", "n_gpus"]
        tight = d.loc[d["verdict"] == "tight", "n_gpus"]
        tight = tight[tight < ok.min()] if len(ok) else tight
        said = f"from {int(ok.min()):,} GPUs" if len(ok) else f"not up to {top:,} GPUs"
        if len(tight):
            said += f" (tight at {', '.join(f'{int(n):,}' for n in sorted(tight))})"
        out.setdefault(model, {})[STRATEGY_NAMES[strategy]] = said
    return pd.DataFrame(out).T.rename_axis("model")


def tokens_sweep(a: dict, model="smollm3-3b", n_gpus: int = 16, micro_batches=(1, 2, 4, 8)) -> pd.DataFrame:
    """How the verdict at ``n_gpus`` moves with tokens per step: FULL_SHARD and HSDP for each micro-batch,
    with the recipe's accumulation reducing every micro-batch, and under ``no_sync`` (FSDP1 ``no_sync()``:
    one reduction per optimizer step, paid for with a full unsharded gradient on every GPU). ``memory per GPU
    (GiB)``: the tensor peak + CUDA context + NCCL; ``verdict``: the fit verdict's word on ``a["gpu"]``
    (``hardware.fit_verdict``)."""
    rows = []
    gpu = get_gpu(a["gpu"])
    acc = a["gradient_accumulation_steps"]
    kw = {k: a[k] for k in ("gpu", "gpus_per_node", "network", "mfu", "seq_len", "fsdp_version")}
    for strategy in ("FULL_SHARD", "HYBRID_SHARD"):
        for mb in micro_batches:
            for no_sync in (False, True):
                step = estimate_step(model, strategy=strategy, n_gpus=n_gpus, micro_batch=mb,
                                     gradient_accumulation_steps=acc, no_sync=no_sync, **kw)  # fmt: skip
                mem = estimate_memory(
                    model, world_size=n_gpus, strategy=strategy, seq_len=a["seq_len"], micro_batch=mb,
                    activation_checkpointing=a["activation_checkpointing"], fsdp_version=a["fsdp_version"],
                    gpus_per_node=a["gpus_per_node"], no_sync=no_sync, loss_path=a.get("loss_path", "transformers"),
                    adamw=a.get("adamw", "foreach"),
                )  # fmt: skip
                rows.append({
                    "strategy": STRATEGY_NAMES[strategy],
                    "tokens per GPU per micro-batch": f"{mb * a['seq_len']:,}",
                    "gradient reduction": "once per step (no_sync)" if no_sync else f"every micro-batch ({acc}x)",
                    "efficiency": _pct(step["efficiency"]),
                    "memory per GPU (GiB)": f"{mem.peak_bytes / GIB:,.1f}",
                    "verdict": fit_verdict(mem, gpu).word,
                    "_efficiency": step["efficiency"],
                    "_gpu": gpu.name,
                })  # fmt: skip
    return pd.DataFrame(rows)


def verdicts_markdown(scaling: pd.DataFrame, sweep: pd.DataFrame, n_gpus: int = 16) -> str:
    """The chapter's verdict sentences, from the numbers (model = the first one in ``scaling``)."""
    model = scaling["model"].iloc[0]
    at = scaling[(scaling["model"] == model)].set_index(["strategy", "n_gpus"])["efficiency"]
    top = int(scaling["n_gpus"].max())
    fs = sweep[sweep["strategy"] == STRATEGY_NAMES["FULL_SHARD"]]
    every = fs[~fs["gradient reduction"].str.startswith("once")]
    best = every.loc[every["_efficiency"].idxmax()]
    tok = "tokens per GPU per micro-batch"
    moves = ", ".join(f"{r[tok]} tokens give {r['efficiency']}" for _, r in every.iterrows())
    return (
        f"For {model} on the book's recipe, FULL_SHARD keeps {_pct(at[('FULL_SHARD', 8)])} of the compute-only "
        f"speed on 8 GPUs (one node) and {_pct(at[('FULL_SHARD', n_gpus)])} on {n_gpus} (two nodes); HSDP keeps "
        f"{_pct(at[('HYBRID_SHARD', n_gpus)])} on {n_gpus} and {_pct(at[('HYBRID_SHARD', top)])} on {top:,}. "
        f"More tokens per micro-batch move the FULL_SHARD verdict on {n_gpus} GPUs: "
        f"{moves} "
        f"(best: {best['efficiency']} at {best[tok]} tokens, "
        f"{best['memory per GPU (GiB)']} GiB tensor peak per GPU, {best['verdict']} on {best['_gpu']}). More "
        "accumulation steps alone do not: FSDP gathers and "
        "reduces for every micro-batch, so communication grows with the compute it should hide."
    )


def tokens_sweep_view(sweep: pd.DataFrame) -> pd.DataFrame:
    """``tokens_sweep`` pivoted: one row per tokens per micro-batch, one column per (strategy, reduction),
    each cell "efficiency · tensor peak per GPU · fit verdict" ("41.3% · 30.1 GiB · fits")."""
    cell = sweep["efficiency"] + " · " + sweep["memory per GPU (GiB)"] + " GiB · " + sweep["verdict"]
    table = sweep.assign(cell=cell).pivot(
        index="tokens per GPU per micro-batch", columns=["strategy", "gradient reduction"], values="cell"
    )
    order = list(dict.fromkeys(sweep["tokens per GPU per micro-batch"]))
    return table.reindex(order)


def no_sync_markdown(sweep: pd.DataFrame, a: dict) -> str:
    """What FSDP1 ``no_sync`` buys and costs for FULL_SHARD at the recipe's tokens per micro-batch
    (``a``: :func:`book_assumptions`; its ``seq_len`` × ``micro_batch``), read from :func:`tokens_sweep`.

    Raises ValueError when the sweep has no row for that many tokens (sweep the recipe's micro-batch).
    """
    tokens = f"{a['seq_len'] * a['micro_batch']:,}"
    fs = sweep[
        (sweep["strategy"] == STRATEGY_NAMES["FULL_SHARD"])
        & (sweep["tokens per GPU per micro-batch"] == tokens)
    ]
    if len(fs) != 2:
        raise ValueError(
            f"the sweep has no FULL_SHARD rows at {tokens} tokens per micro-batch (the recipe's micro-batch "
            f"{a['micro_batch']}); include it in tokens_sweep(..., micro_batches=...)."
        )
    every, once = fs.iloc[0], fs.iloc[1]
    extra = float(once["memory per GPU (GiB)"].replace(",", "")) - float(
        every["memory per GPU (GiB)"].replace(",", "")
    )
    return (
        f"Reducing gradients once per optimizer step instead of after every micro-batch (FSDP1 `no_sync()`) takes "
        f"FULL_SHARD at {tokens} tokens from {every['efficiency']} to {once['efficiency']}, and costs {extra:,.1f} GiB "
        "more per GPU: every GPU then holds the whole unsharded gradient between micro-batches."
    )


def latency_bounds(models, a: dict, n_gpus: int = 1024) -> pd.DataFrame:
    """Efficiency at ``n_gpus`` with NCCL's ring latency and with no latency at all: the two bounds."""
    cols = {}
    for label, latency in (("ring latency (default)", True), ("no latency", False)):
        d = scaling_table(models, n_gpus=(n_gpus,), latency=latency, **a)
        cols[label] = d.set_index(["model", d["strategy"].map(STRATEGY_NAMES)])["efficiency"].map(_pct)
    return pd.DataFrame(cols).rename_axis(["model", "strategy"])
