"""Communication model: every collective one rank runs per optimizer step, and the bytes it moves.

Chapter "Scaling out" (``notebooks/07_scaling.ipynb``). Pure functions of a model config (exact parameter counts
and FSDP padding from ``smolfsdp.estimate.params`` and ``smolfsdp.estimate.layout``), a strategy and a cluster
(``smolfsdp.estimate.cluster``, which prices each collective); no GPU needed. ``smolfsdp.estimate.scaling`` turns
these into step times; ``smolfsdp.traces.collective_sizes`` reads the collective sizes a real profiler trace
recorded, so the model can be checked against runs.

    python -c "from smolfsdp.measure import comm; print(comm.step_bytes(comm.estimate_collectives('tiny')))"

Model, per rank and optimizer step (collectives: PyTorch FSDP paper, Zhao et al. 2023,
arXiv:2304.11277, sec. 3-4; ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054, sec. 5-7): FULL_SHARD
(ZeRO-3) all-gathers each unit before forward and again before backward and reduce-scatters its
gradient; SHARD_GRAD_OP (ZeRO-2, ``reshard_after_forward=False``) skips the backward all-gather;
HYBRID_SHARD (HSDP) does both inside a shard group and all-reduces the gradient shard across
replicas; NO_SHARD is DDP (bucketed all-reduce of all gradients, Li et al. 2020, arXiv:2006.15704), which
under gradient accumulation syncs once per optimizer step, as accelerate and the Trainer run it by default
(``no_sync`` on the other micro-batches).
"""

from __future__ import annotations

import math

import pandas as pd

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.cluster import Cluster, collective_cost, resolve_cluster, whole_count
from smolfsdp.estimate.layout import unit_sizes
from smolfsdp.estimate.params import count_parameters, model_units, resolve_model_config
from smolfsdp.estimate.recipes import STRATEGIES, STRATEGY_ALIASES, check_choice

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
#: DDP's default gradient bucket, ``bucket_cap_mb=25`` (torch.nn.parallel.DistributedDataParallel).
DDP_BUCKET_BYTES = 25 * 2**20
COLUMNS = ["unit", "phase", "kind", "group", "group_size", "count", "numel", "numel_unpadded", "dtype_bytes",
           "logical_bytes", "in_bytes", "sent_bytes", "received_bytes", "link", "bus_gbs", "latency_s", "time_s"]  # fmt: skip


def canonical_strategy(name: str) -> str:
    """A strategy name or alias (DDP, ZeRO-2, ZERO3, HSDP, any case) as one of :data:`STRATEGIES`."""
    key = STRATEGY_ALIASES.get(str(name).upper().replace("-", ""), str(name).upper())
    key = check_choice(key, (*STRATEGIES, *STRATEGY_ALIASES), "strategy")
    return STRATEGY_ALIASES.get(key, key)


def estimate_collectives(
    model="smollm3-3b",
    *,
    strategy: str = "FULL_SHARD",
    cluster: Cluster | None = None,
    n_gpus: int | None = None,
    shard_size: int | None = None,
    fsdp_version: int = 2,
    mixed_precision: str = "bf16",
    reduce_dtype: str = "fp32",
    gradient_accumulation_steps: int = 1,
    no_sync: bool | None = None,
    root_reshard_after_forward: bool | None = None,
    use_orig_params: bool = True,
    include_loop: bool = False,
    latency: bool = True,
    **cluster_spec,
) -> pd.DataFrame:
    """Every collective one rank runs in one optimizer step, one row per (unit, phase, kind).

    Columns: ``unit, phase`` (forward/backward/step), ``kind``, ``group`` (shard/replicate/world),
    ``group_size, count`` (per step), ``numel`` (the full tensor: all-gather output, reduce-scatter
    input, all-reduce buffer; FSDP padding included), ``numel_unpadded``, ``dtype_bytes``,
    ``logical_bytes = numel * dtype_bytes``, ``in_bytes`` (what this rank passes in: its shard for an
    all-gather), ``sent_bytes`` = ``received_bytes`` = ``ring_factor * logical_bytes``, ``link``,
    ``bus_gbs``, ``latency_s``, ``time_s`` (one collective: latency + sent / bus bandwidth). Totals:
    multiply by ``count``.

    Rules (PyTorch FSDP paper, arXiv:2304.11277, sec. 3.2-3.3; ZeRO sec. 5): per micro-batch,
    FULL_SHARD all-gathers every unit in forward and again in backward, except the root when it is
    not resharded after forward (FSDP1 always keeps it; FSDP2 keeps it when the root's
    ``reshard_after_forward`` is False, which ``smolfsdp.sharding.fsdp2.apply_fsdp2`` passes by default,
    so ``root_reshard_after_forward=None`` means False for both; True models a resharded FSDP2 root,
    all-gathered again for backward). SHARD_GRAD_OP:
    forward all-gathers only. Gradients: one reduce-scatter per unit per micro-batch, or once per step
    with ``no_sync`` (FSDP1 ``no_sync()`` / FSDP2 ``set_requires_gradient_sync(False)``, which keep
    unsharded gradients); HYBRID_SHARD adds an all-reduce of each gradient shard across the
    ``n_gpus / shard_size`` replicas (default: one node). NO_SHARD: DDP all-reduces all gradients in 25 MiB
    buckets. ``no_sync=None``: True for DDP (accelerate's and the Trainer's default; free), False for FSDP (as smolfsdp runs it).
    Dtypes: all-gathers in the compute dtype (``mixed_precision`` bf16 -> 2 bytes, "no" -> 4),
    gradient reductions in ``reduce_dtype`` (fp32, as smolfsdp's FSDP1 ``MixedPrecision`` and FSDP2
    ``MixedPrecisionPolicy`` set it; ignored when ``mixed_precision="no"``).
    ``include_loop``: also the small all-reduces ``smolfsdp.train.native``'s loop makes each step (label
    tokens: 1 int64; gradient norm: FSDP1 one fp32, FSDP2 one fp32 per parameter tensor; loss, real and
    computed tokens: 3 fp64), for comparing with a trace of that loop.

    Cluster: ``cluster``, or one built from ``n_gpus`` (default 2) and ``cluster_spec`` (``gpu``,
    ``gpus_per_node``, ``nodes``, ``network``: ``smolfsdp.estimate.cluster.CLUSTER_KEYS``) as
    ``cluster.resolve_cluster`` does.

    Raises ConfigError: unknown strategy/dtype, a shard size that does not divide ``n_gpus``,
    ``gradient_accumulation_steps < 1`` or not whole, fsdp_version not 1 or 2, and
    ``resolve_cluster``'s errors (``cluster`` with a different ``n_gpus`` or with ``gpu``/...).
    """
    strategy = canonical_strategy(strategy)
    cl = resolve_cluster(cluster, n_gpus, **cluster_spec)
    n = cl.n_gpus
    _check_dtypes(fsdp_version, mixed_precision, reduce_dtype)
    k = whole_count("gradient_accumulation_steps", gradient_accumulation_steps)
    shard = _shard_size(strategy, cl, shard_size)
    config = resolve_model_config(model)
    c = DTYPE_BYTES["bf16"] if mixed_precision == "bf16" else 4
    r = DTYPE_BYTES[reduce_dtype] if mixed_precision == "bf16" else 4
    rows = _Rows(cl, latency)
    reductions = 1 if (strategy == "NO_SHARD" if no_sync is None else no_sync) else k
    if strategy == "NO_SHARD":
        total = count_parameters(config).total
        buckets = max(1, math.ceil(total * r / DDP_BUCKET_BYTES))
        per = math.ceil(total / buckets)
        rows.add("all", "backward", "all-reduce", "world", n, reductions * buckets, per, per, r)
    else:
        regather_root = bool(root_reshard_after_forward)  # None: the package's default, root kept gathered
        sizes = unit_sizes(config, shard, fsdp_version, c, use_orig_params)
        _fsdp_rows(rows, sizes, strategy, shard, k, reductions, regather_root, c, r)
    if include_loop:
        _loop_rows(rows, config, fsdp_version, strategy)
    df = pd.DataFrame(rows.rows, columns=COLUMNS)
    df.attrs.update(strategy=strategy, n_gpus=n, shard_size=shard, replicas=n // shard,
                    fsdp_version=fsdp_version, reductions_per_step=reductions)  # fmt: skip
    return df


class _Rows:
    """The rows of :func:`estimate_collectives`, each collective priced on ``cl`` as it is added."""

    def __init__(self, cl: Cluster, latency: bool):
        self.cl, self.latency, self.rows = cl, latency, []

    def add(self, unit, phase, kind, group, size, count, numel, real, nbytes) -> None:
        """One row; nothing when the collective does not run (``count`` 0) or has no peer (``size`` 1)."""
        if count == 0 or size == 1:
            return
        logical = numel * nbytes
        # ranks r = replica * shard + s: a shard group is contiguous, a replicate group strided by shard
        span = self.cl.n_gpus if group == "replicate" else size
        sent, link, bw, lat, time_s = collective_cost(self.cl, kind, size, span, logical, self.latency)
        self.rows.append(
            dict(
                unit=unit, phase=phase, kind=kind, group=group, group_size=size, count=count,
                numel=numel, numel_unpadded=real, dtype_bytes=nbytes, logical_bytes=logical,
                in_bytes=logical // size if kind == "all-gather" else logical, sent_bytes=sent,
                received_bytes=sent, link=link, bus_gbs=bw, latency_s=lat, time_s=time_s,
            )
        )  # fmt: skip


def _fsdp_rows(rows: _Rows, sizes: dict, strategy: str, shard: int, k: int, reductions: int, regather_root: bool,
               c: int, r: int) -> None:  # fmt: skip
    """Per unit: forward all-gather, backward re-gather (not under SHARD_GRAD_OP, nor for a root kept
    from forward), reduce-scatter, and the HSDP all-reduce across replicas (no row with one replica)."""
    replicas = rows.cl.n_gpus // shard
    for unit, (numel, real) in sizes.items():
        rows.add(unit, "forward", "all-gather", "shard", shard, k, numel, real, c)
        regather = strategy != "SHARD_GRAD_OP" and (unit != "root" or regather_root)
        rows.add(unit, "backward", "all-gather", "shard", shard, k if regather else 0, numel, real, c)
        rows.add(unit, "backward", "reduce-scatter", "shard", shard, reductions, numel, real, r)
        rows.add(unit, "backward", "all-reduce", "replicate", replicas, reductions, numel // shard,
                 real // shard, r)  # fmt: skip


def _loop_rows(rows: _Rows, config, fsdp_version: int, strategy: str) -> None:
    """The small all-reduces of ``smolfsdp.train.native``'s loop, once per step."""
    n = rows.cl.n_gpus
    n_tensors = sum(len(ps) for ps in model_units(config).values())
    rows.add("loop", "step", "all-reduce", "world", n, 1, 1, 1, 8)  # label tokens, int64
    gn = n_tensors if fsdp_version == 2 and strategy != "NO_SHARD" else 1
    rows.add("loop", "step", "all-reduce", "world", n, 1, gn, gn, 4)  # gradient norm(s), fp32
    rows.add("loop", "step", "all-reduce", "world", n, 1, 3, 3, 8)  # loss, real and computed tokens, fp64


def _check_dtypes(fsdp_version: int, mixed_precision: str, reduce_dtype: str) -> None:
    if fsdp_version not in (1, 2):
        raise ConfigError(f"fsdp_version={fsdp_version}: FSDP is version 1 or 2.")
    if mixed_precision not in ("no", "bf16"):
        raise ConfigError(f"mixed_precision={mixed_precision!r}: use 'no' (fp32) or 'bf16'.")
    if reduce_dtype not in DTYPE_BYTES:
        raise ConfigError(f"reduce_dtype={reduce_dtype!r}: use one of {tuple(DTYPE_BYTES)}.")


def _shard_size(strategy: str, cl: Cluster, shard_size: int | None) -> int:
    """Ranks a parameter is sharded over: the world (FULL_SHARD, SHARD_GRAD_OP), 1 (NO_SHARD), or for
    HYBRID_SHARD ``shard_size`` (default: one node), which must divide the GPU count."""
    n = cl.n_gpus
    shard = {"FULL_SHARD": n, "SHARD_GRAD_OP": n, "NO_SHARD": 1}.get(strategy)
    if strategy == "HYBRID_SHARD":
        shard = cl.gpus_per_node if shard_size is None else whole_count("shard_size", shard_size)
        if n % shard:
            raise ConfigError(
                f"mesh {n // max(shard, 1)} x {shard} does not multiply to {n} GPUs: give a shard_size "
                f"that divides n_gpus (e.g. {cl.gpus_per_node}, one node)."
            )
    return shard


def step_bytes(collectives: pd.DataFrame) -> pd.DataFrame:
    """Per kind: collectives per step, full-tensor bytes, padding bytes and wire bytes sent per rank."""
    d = collectives.assign(
        logical=lambda x: x["logical_bytes"] * x["count"],
        padding=lambda x: (x["numel"] - x["numel_unpadded"]) * x["dtype_bytes"] * x["count"],
        sent=lambda x: x["sent_bytes"] * x["count"],
        numel_total=lambda x: x["numel"] * x["count"],
    )
    g = d.groupby("kind")[["count", "numel_total", "logical", "padding", "sent"]].sum()
    return g.rename(columns={"logical": "logical_bytes", "padding": "padding_bytes", "sent": "sent_bytes"})
