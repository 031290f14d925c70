"""How far FSDP scales: projected step time with overlap, and a table of time and memory per GPU count.

Chapter "Scaling out" (``notebooks/07_scaling.ipynb``). Pure functions: the collectives of
``smolfsdp.estimate.comm`` priced on a ``smolfsdp.estimate.cluster.Cluster``, compute time from the
FLOPs of ``smolfsdp.measure.benchmark``, memory from ``smolfsdp.estimate.memory``. No GPU needed.

    python -c "from smolfsdp.measure import scaling; print(scaling.scaling_table(['smollm3-3b']))"
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pandas as pd

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.calibration import calibrated_mfu, hfu_calibration, mfu_calibration, run_mfu
from smolfsdp.estimate.cluster import (
    DEFAULT_GPU,
    DEFAULT_NETWORK,
    Cluster,
    build_cluster,
    resolve_cluster,
    split_cluster_kwargs,
    whole_count,
)
from smolfsdp.estimate.comm import estimate_collectives
from smolfsdp.estimate.flops import flops_per_token
from smolfsdp.estimate.hardware import fit_verdict
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import count_parameters, resolve_model_config
from smolfsdp.estimate.recipes import RECIPES, STRATEGIES, get_recipe


def _flops_per_token(config, seq_len: int, lora=None) -> float:
    q = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n = count_parameters(config, lora)
    geometry = (config.num_hidden_layers, config.num_attention_heads, int(q), seq_len)
    return flops_per_token(n.total, *geometry, trainable_params=n.trainable)


def estimate_step(
    model="smollm3-3b",
    *,
    strategy: str = "FULL_SHARD",
    cluster: Cluster | None = None,
    n_gpus: int | None = None,
    seq_len: int = 4096,
    micro_batch: int = 1,
    gradient_accumulation_steps: int = 1,
    mfu: float | str | None = None,
    activation_checkpointing: bool | None = None,
    ac_mode: str = "full",
    ac_every: int | None = None,
    lora=None,
    **kwargs,
) -> dict:
    """Projected time of one optimizer step on one rank, with and without overlap (weak scaling:
    ``micro_batch x seq_len`` tokens per GPU per micro-batch, whatever the GPU count).

    compute: ``tokens x (6N + 12 L H Q T)`` FLOPs (PaLM appendix B, ``smolfsdp.estimate.flops``; ``lora``: 4 per
    frozen weight, collectives as full) at ``mfu`` x the bf16 dense peak; a third forward, two thirds backward.
    comm: the sum of ``comm.estimate_collectives`` times. Overlap model (PyTorch FSDP paper, sec. 3.3
    and 5.2): forward all-gathers hide behind forward compute, backward all-gathers, reduce-scatters
    and all-reduces behind backward compute, except what nothing can hide: per micro-batch the first
    forward all-gather (nothing to compute yet) and the last gradient collective of the backward (no
    compute left; for HSDP its reduce-scatter and all-reduce; for DDP the last bucket), and the
    loop's collectives. Under ``no_sync`` (DDP's default, ``comm.estimate_collectives``) the gradient reductions
    hide only behind the backward of the micro-batch that syncs (1/k of it); compute and comm do not slow each other.
    ``step_s = sum over phases of exposed + max(compute, comm - exposed)``; ``serial_s = compute +
    comm``; ``efficiency = compute / step_s`` (1.0 when all communication is hidden; weak-scaling
    efficiency against a GPU that only computes). Cluster: ``cluster`` or ``n_gpus`` (default 2) and the
    ``cluster.CLUSTER_KEYS`` in ``kwargs`` (``cluster.resolve_cluster``); other ``kwargs`` go to ``comm.estimate_collectives``. ``mfu``: a fraction; None with ``activation_checkpointing``
    given (True with ``ac_mode`` / ``ac_every``, or False): ``calibration.run_mfu``, the GPU's calibrated HFU less what
    that checkpointing recomputes; None without it: ``calibration.mfu_calibration`` (the GPU's median published
    MFU, pooled over all rows for a GPU without any); ``"calibrated"``: ``calibration.calibrated_mfu`` (ConfigError
    for a GPU without published rows). Raises ConfigError for mfu outside (0, 1], sizes < 1 or not whole, a
    sequence longer than the model allows, and ``estimate_collectives``' errors."""
    ac = (activation_checkpointing, ac_mode, ac_every)
    mfu = _resolve_mfu(mfu, cluster, n_gpus, kwargs, model=model, seq_len=seq_len, ac=ac)
    if not 0 < mfu <= 1:
        raise ConfigError(f"mfu={mfu}: give the model FLOP utilisation as a fraction in (0, 1], e.g. 0.4.")
    seq_len, micro_batch = whole_count("seq_len", seq_len), whole_count("micro_batch", micro_batch)
    spec, kwargs = split_cluster_kwargs(kwargs)
    cl = resolve_cluster(cluster, n_gpus, **spec)
    config = resolve_model_config(model)
    if seq_len > config.max_position_embeddings:
        raise ConfigError(
            f"seq_len={seq_len} is above max_position_embeddings={config.max_position_embeddings}."
        )
    k = whole_count("gradient_accumulation_steps", gradient_accumulation_steps)
    coll = estimate_collectives(
        config, strategy=strategy, cluster=cl, gradient_accumulation_steps=k, **kwargs
    )
    tokens = micro_batch * seq_len * k
    if math.isnan(cl.gpu.bf16_dense_tflops):
        raise ConfigError(
            f"GPU {cl.gpu.name!r} has no bf16 peak TFLOP/s; pick one from smolfsdp.estimate.hardware.GPUS."
        )
    compute = tokens * _flops_per_token(config, seq_len, lora) / (cl.gpu.bf16_dense_tflops * 1e12 * mfu)
    step, comm, exposed_min = _overlap(coll, compute, k)
    return {
        "strategy": coll.attrs["strategy"],
        "n_gpus": cl.n_gpus,
        "nodes": cl.nodes,
        "shard_size": coll.attrs["shard_size"],
        "tokens_per_gpu": tokens,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_s": step - compute,
        "unhideable_s": exposed_min,
        "step_s": step,
        "serial_s": compute + comm,
        "overlappable_share": (comm - exposed_min) / comm if comm else 1.0,
        "hidden_share": (compute + comm - step) / comm if comm else 1.0,
        "efficiency": compute / step,
        "tokens_per_s_per_gpu": tokens / step,
        "mfu": mfu,
        "sent_bytes": float((coll["sent_bytes"] * coll["count"]).sum()),
        "logical_bytes": float((coll["logical_bytes"] * coll["count"]).sum()),
    }


def _overlap(coll: pd.DataFrame, compute: float, k: int) -> tuple[float, float, float]:
    """(step time, communication time, the part nothing can hide) under :func:`estimate_step`'s
    overlap model, for ``coll`` (``estimate_collectives``) and ``compute`` seconds over ``k``
    micro-batches."""
    t = coll["time_s"] * coll["count"]
    fwd = coll["phase"].eq("forward")
    bwd = coll["phase"].eq("backward")
    comm_f, comm_b = float(t[fwd].sum()), float(t[bwd].sum())
    comm_loop = float(t[coll["phase"].eq("step")].sum())
    gathers = coll[fwd & coll["kind"].eq("all-gather")]
    first = gathers["time_s"].iloc[0] * k if len(gathers) else 0.0  # the root, per micro-batch
    grads = coll[bwd & coll["kind"].ne("all-gather")]
    reductions = coll.attrs["reductions_per_step"]
    if grads.empty:
        last = 0.0
    elif coll.attrs["strategy"] == "NO_SHARD":  # the last bucket of each reduction
        last = grads["time_s"].iloc[0] * reductions
    else:  # backward ends with the root's gradient: its reduce-scatter (+ HSDP all-reduce)
        last = grads.loc[grads["unit"].eq("root"), "time_s"].sum() * reductions
    c_f = compute / 3
    c_b = compute - c_f
    # gradient reductions run in the backward of the micro-batches that sync: under no_sync only the last
    # one's (a 1/k share of the backward compute) can hide them
    red_b = float(t[bwd & coll["kind"].ne("all-gather")].sum())
    window = c_b * reductions / k
    # = sum over phases of exposed + max(compute, comm - exposed), written so no comm gives compute exactly
    exposed_b = max(0.0, comm_b - last - c_b, red_b - last - window)
    exposed = first + last + comm_loop + max(0.0, comm_f - first - c_f) + exposed_b
    return compute + exposed, comm_f + comm_b + comm_loop, first + last + comm_loop


def recipe_dtypes(recipe: str) -> dict[str, str]:
    """The communication dtypes of a ``smolfsdp.estimate.recipes.RECIPES`` recipe, as
    ``comm.estimate_collectives`` takes them: ``mixed_precision`` "bf16" when the recipe computes (so
    all-gathers) in 2-byte units, else "no" (fp32); ``reduce_dtype`` the dtype of its sharded gradient,
    which FSDP reduce-scatters into (``Recipe.grad_bytes``: 4 -> "fp32", 2 -> "bf16"). E.g. "fp32" ->
    no/fp32, "hf-fsdp-bf16" -> bf16/fp32, "pure-bf16" -> bf16/bf16. Raises ConfigError for an unknown
    recipe (nearest name).
    """
    rec = get_recipe(recipe)
    names = {4: "fp32", 2: "bf16"}
    return {
        "mixed_precision": "bf16" if rec.compute_bytes == 2 else "no",
        "reduce_dtype": names[rec.grad_bytes],
    }


def _seq(value, what) -> tuple:
    """A single name/config/number as a one-element tuple; lists, tuples, ranges, sets, generators and
    1-d arrays as their items (a ``PretrainedConfig`` is iterable too, over its keys: it counts as one)."""
    many = isinstance(value, (list, tuple, range, set, frozenset, Iterator)) or getattr(value, "ndim", 0) >= 1
    if not many:
        return (value,)
    out = tuple(value)
    if not out:
        raise ConfigError(f"{what} is empty: give at least one.")
    return out


def _recipe_kwargs(recipe: str, kwargs: dict) -> dict:
    """``kwargs`` with the recipe's communication dtypes; ConfigError when ``kwargs`` contradict them
    (naming the recipes that match) or give a cluster (the table builds one per GPU count)."""
    if "cluster" in kwargs or "nodes" in kwargs:
        raise ConfigError(
            "scaling_table builds one cluster per GPU count: give gpu=, gpus_per_node=, network= instead of "
            "cluster= or nodes=."
        )
    dtypes = recipe_dtypes(recipe)
    for key, value in dtypes.items():
        if key in kwargs and kwargs[key] != value:
            asked = {**dtypes, **{k: kwargs[k] for k in dtypes if k in kwargs}}
            match = [r for r in RECIPES if recipe_dtypes(r) == asked]
            raise ConfigError(
                f"{key}={kwargs[key]!r} contradicts recipe={recipe!r}, which communicates with "
                f"mixed_precision={dtypes['mixed_precision']!r}, reduce_dtype={dtypes['reduce_dtype']!r}: "
                f"drop {key} or pick a recipe that matches"
                + (
                    f" ({', '.join(repr(r) for r in match)})."
                    if match
                    else " (none of smolfsdp.estimate.recipes.RECIPES does)."
                )
            )
    return {**kwargs, **dtypes}


def _model_label(m, config) -> str:
    label = m if isinstance(m, str) else getattr(config, "name_or_path", "") or config.model_type
    if not isinstance(m, str) and config.num_hidden_layers == 80 and config.hidden_size == 8192:
        label = "llama-3-70b-like"
    return label


def scaling_table(
    models=("smollm3-3b",),
    strategies=STRATEGIES,
    n_gpus=tuple(2**i for i in range(1, 11)),
    *,
    gpu: str = DEFAULT_GPU,
    gpus_per_node: int = 8,
    network: str = DEFAULT_NETWORK,
    recipe: str = "hf-fsdp-bf16",
    activation_checkpointing: bool = True,
    seq_len: int = 4096,
    micro_batch: int = 1,
    mfu: float | None = None,
    loss_path: str = "transformers",
    adamw: str = "foreach",
    **kwargs,
) -> pd.DataFrame:
    """One row per (model, strategy, GPU count): :func:`estimate_step` plus the per-GPU memory of
    ``smolfsdp.estimate.memory.estimate_memory`` (same recipe, sequence, micro-batch, gradient accumulation, shard
    group: at the book recipe's settings the peak ``smolfsdp.estimate.recipe_peak`` gives) and whether
    it fits the GPU (``memory_gib``: the tensor peak + CUDA context + NCCL; ``need_gib``: reserved + both, what
    the verdict decides on; ``gpu_memory_gib``; ``verdict``: ``hardware.fit_verdict``'s word, fits / tight /
    does not fit; ``fits``: the word is "fits"; ``loss_path`` and ``adamw``: the loss and the AdamW step,
    ``estimate.loss_path``, ``estimate.adamw_step``: native's by default). Weak scaling: tokens per GPU fixed.
    ``models``: names for ``resolve_model_config`` or configs (e.g. ``params.llama3_70b_config()``); a
    single name or config, a single strategy and a single GPU count are taken as one-element lists.
    The recipe sets the communication dtypes too (:func:`recipe_dtypes`: "fp32" all-gathers and
    reduces in fp32); compute time is always at the GPU's bf16 dense peak (the GPU table has no fp32
    figure). Raises ConfigError for ``mixed_precision``/``reduce_dtype`` that contradict the recipe
    (naming the recipes that match), a ``cluster`` (this builds one per GPU count from ``gpu``,
    ``gpus_per_node``, ``network``), and :func:`estimate_step`'s and ``estimate_memory``'s errors.
    """
    kwargs = _recipe_kwargs(recipe, kwargs)
    dtypes = recipe_dtypes(recipe)
    models, strategies, n_gpus = (
        _seq(models, "models"),
        _seq(strategies, "strategies"),
        _seq(n_gpus, "n_gpus"),
    )
    rows = []
    for m in models:
        config = resolve_model_config(m)
        for s in strategies:
            for n in n_gpus:
                cl = build_cluster(n, gpu, gpus_per_node=gpus_per_node, network=network)
                step = estimate_step(
                    config,
                    strategy=s,
                    cluster=cl,
                    seq_len=seq_len,
                    micro_batch=micro_batch,
                    mfu=mfu,
                    activation_checkpointing=activation_checkpointing,
                    **kwargs,
                )
                mem = estimate_memory(
                    config, world_size=n, strategy=step["strategy"], recipe=recipe, seq_len=seq_len,
                    micro_batch=micro_batch, activation_checkpointing=activation_checkpointing,
                    fsdp_version=kwargs.get("fsdp_version", 2), gpus_per_node=cl.gpus_per_node,
                    gradient_accumulation_steps=kwargs.get("gradient_accumulation_steps", 1), loss_path=loss_path,
                    adamw=adamw,
                )  # fmt: skip
                fit = fit_verdict(mem, cl.gpu)  # the verdict of smolfsdp memory and every page
                rows.append({
                    "model": _model_label(m, config),
                    **{k: (float(v) if hasattr(v, "dtype") else v) for k, v in step.items()},
                    "memory_gib": fit.peak_gib, "need_gib": fit.need_gib, "gpu_memory_gib": fit.gpu_gib,
                    "verdict": fit.word, "fits": fit.fits,
                })  # fmt: skip
    df = pd.DataFrame(rows)
    df.attrs["assumptions"] = (
        f"{getattr(gpu, 'name', gpu)}, {gpus_per_node}/node, {getattr(network, 'name', network)}; {recipe} "
        f"({'bf16' if dtypes['mixed_precision'] == 'bf16' else 'fp32'} all-gathers, "
        f"{dtypes['reduce_dtype']} reductions), "
        f"seq {seq_len} x micro-batch {micro_batch} per GPU, "
        f"{_mfu_words(mfu, getattr(gpu, 'name', gpu), activation_checkpointing)}, activation checkpointing {'on' if activation_checkpointing else 'off'}; "
        "NCCL ring bandwidth and latency, overlap as in scaling.estimate_step"
    )
    return df


def _mfu_words(mfu, gpu_name: str, activation_checkpointing: bool) -> str:
    """The MFU line of ``scaling_table``'s assumptions: per model from the HFU calibration when not given."""
    if mfu is None:
        ac = "with" if activation_checkpointing else "without"
        return f"MFU per model {ac} its recomputation from the {hfu_calibration(gpu_name)['text']}"
    return mfu_text(mfu, gpu_name)


def _resolve_mfu(mfu, cluster, n_gpus, kwargs, *, model=None, seq_len=None, ac=(None, "full", None)) -> float:
    """``mfu`` as a fraction; ``"calibrated"``: the published calibration for the cluster's GPU (ConfigError
    without one); ``None``: with ``ac`` = (activation_checkpointing, ac_mode, ac_every) stated, ``calibration.run_mfu``;
    else ``mfu_calibration`` (that calibration, or the pooled one)."""
    if mfu is not None and mfu != "calibrated":
        return mfu
    spec, _ = split_cluster_kwargs(kwargs)
    gpu = resolve_cluster(cluster, n_gpus, **spec).gpu
    if mfu is None and ac[0] is not None:
        return run_mfu(gpu.name, model, seq_len=seq_len, ac_mode=ac[1] if ac[0] else None, ac_every=ac[2])[
            "mfu"
        ]
    if mfu is None:
        return mfu_calibration(gpu.name)["mfu"]
    table = calibrated_mfu()
    if gpu.name not in table:
        raise ConfigError(
            f"mfu='calibrated': no published rows on {gpu.name} (calibrated: {', '.join(table)}); give mfu=0.4."
        )
    return table[gpu.name]


def mfu_text(mfu: float | None, gpu_name: str, run: dict | None = None) -> str:
    """How the book states the MFU a projection used: the calibration's line (``mfu_calibration``: its source
    and error % against the published rows; with ``run``, the keywords of ``calibration.run_mfu`` after the GPU, its
    line) when ``mfu`` is None or equals it, else ``MFU x % (given)``."""
    cal = run_mfu(gpu_name, **run) if run else mfu_calibration(gpu_name)
    if mfu is None or mfu == cal["mfu"]:
        return cal["text"]
    return f"MFU {100 * mfu:.1f} % (given; the published calibration would be {100 * cal['mfu']:.1f} %)"
