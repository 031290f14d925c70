"""Communication model: bytes each rank sends per step, the time they take, and how far FSDP scales.

Chapter "Scaling out" (``notebooks/07_scaling.ipynb``). Pure functions of a model config (exact parameter counts and
FSDP padding from ``smolfsdp.measure.memory``), a strategy and a cluster; no GPU needed. ``smolfsdp.measure.comm_trace``
reads the collective sizes a real profiler trace recorded, so the model can be checked against runs.

    python -c "from smolfsdp import comm; print(comm.scaling_table(['smollm3-3b']))"

Model, per rank and optimizer step (every formula's source is in the docstring that uses it):

* collectives (PyTorch FSDP paper, Zhao et al. 2023, arXiv:2304.11277, sec. 3-4; ZeRO, Rajbhandari
  et al. 2020, arXiv:1910.02054, sec. 5-7): FULL_SHARD (ZeRO-3) all-gathers each unit before forward
  and again before backward and reduce-scatters its gradient; SHARD_GRAD_OP (ZeRO-2,
  ``reshard_after_forward=False``) skips the backward all-gather; HYBRID_SHARD (HSDP) does both inside
  a shard group and all-reduces the gradient shard across replicas; NO_SHARD is DDP (bucketed
  all-reduce of all gradients, Li et al. 2020, arXiv:2006.15704).
* wire bytes of NCCL's ring algorithms (NCCL ``PERFORMANCE.md``, "bus bandwidth"): all-gather and
  reduce-scatter move ``(n-1)/n * S`` per rank, all-reduce ``2(n-1)/n * S``, S the full size.
* time = latency + wire bytes / bus bandwidth; bandwidth from ``smolfsdp.measure.hardware`` (NVLink inside a
  node, the network as soon as a group spans nodes).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd

from smolfsdp.errors import ConfigError
from smolfsdp.measure.hardware import GPU, Network, get_gpu, get_network

STRATEGIES = ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")
ALIASES = {"DDP": "NO_SHARD", "ZERO2": "SHARD_GRAD_OP", "ZERO3": "FULL_SHARD", "HSDP": "HYBRID_SHARD"}
KINDS = ("all-gather", "reduce-scatter", "all-reduce", "broadcast")
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
#: NCCL's ring latency model, ``src/graph/tuning.cc`` (NCCL 2.5, 2019): Ring/Simple base latency
#: 8.4 us plus ``nsteps`` hops of 5.7 us (NVLink, one node) or 6.6 us (network, several nodes), with
#: nsteps = n-1 (all-gather, reduce-scatter) or 2(n-1) (all-reduce). Newer NCCL picks tree/PAT
#: algorithms with lower latency at scale, so this is the pessimistic ring figure.
RING_BASE_US, RING_HOP_NVLINK_US, RING_HOP_NET_US = 8.4, 5.7, 6.6
#: DDP's default gradient bucket, ``bucket_cap_mb=25`` (torch.nn.parallel.DistributedDataParallel).
DDP_BUCKET_BYTES = 25 * 2**20


def _count(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; a whole float (8.0) is accepted. Raises ConfigError otherwise."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = int(value)
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    else:
        raise ConfigError(f"{name}={value!r}: give a whole number (a count), e.g. {name}=8.")
    if n < minimum:
        raise ConfigError(f"{name}={n}: need at least {minimum}.")
    return n


def _strategy(name: str) -> str:
    from smolfsdp.measure.memory import check_choice

    key = ALIASES.get(str(name).upper().replace("-", ""), str(name).upper())
    return check_choice(key, (*STRATEGIES, *ALIASES), "strategy")


def ring_factor(kind: str, n: int) -> float:
    """Bytes each rank sends (and receives) per byte of the full tensor, for NCCL's ring algorithm.

    all-gather, reduce-scatter: ``(n-1)/n``; all-reduce: ``2(n-1)/n`` (NCCL ``PERFORMANCE.md``: bus
    bandwidth = algorithm bandwidth x this factor); broadcast: 1. ``n = 1``: 0 (no traffic).
    Raises ConfigError for an unknown kind or n < 1.
    """
    if n < 1:
        raise ConfigError(f"group size {n}: a collective needs at least 1 rank.")
    if kind not in KINDS:
        raise ConfigError(f"unknown collective {kind!r}; use one of {KINDS}.")
    if n == 1:
        return 0.0
    return {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "broadcast": n / (n - 1)}[kind] * (
        (n - 1) / n
    )


@dataclass(frozen=True)
class Cluster:
    """``n_gpus`` GPUs of one kind in ``nodes`` nodes of ``gpus_per_node``, joined by ``network``."""

    n_gpus: int
    gpus_per_node: int
    nodes: int
    gpu: GPU
    network: Network

    def bus_gbs(self, group_size: int) -> float:
        """GB/s per direction a ring over ``group_size`` consecutive ranks gets: NVLink/PCIe inside a
        node, the per-GPU network rate once it spans nodes (each ring crosses the network at every
        node boundary; with one NIC per GPU the NIC is the bottleneck)."""
        if group_size <= self.gpus_per_node:
            return self.gpu.intra_node_gbs
        return min(self.gpu.intra_node_gbs, self.network.per_gpu_gbs)


def build_cluster(
    n_gpus: int,
    gpu: str | GPU = "H100 SXM",
    *,
    gpus_per_node: int = 8,
    nodes: int | None = None,
    network: str | Network = "InfiniBand NDR 400 Gb/s",
) -> Cluster:
    """A cluster; ``nodes`` (if given) overrides ``gpus_per_node`` as ``n_gpus / nodes``.

    Fewer GPUs than a node holds means one node. Raises ConfigError for ``n_gpus < 1`` or not a whole
    number (likewise ``gpus_per_node``, ``nodes``), a node count that does not divide the GPUs, more
    GPUs than fill whole nodes, an unknown GPU or network (with the nearest names), or a GPU without
    an intra-node bandwidth.
    """
    n_gpus = _count("n_gpus", n_gpus)
    gpus_per_node = _count("gpus_per_node", gpus_per_node)
    if nodes is not None:
        nodes = _count("nodes", nodes)
        if n_gpus % nodes:
            raise ConfigError(
                f"nodes={nodes} does not divide n_gpus={n_gpus}: give a node count that divides the GPUs "
                f"(e.g. {math.gcd(n_gpus, max(nodes, 1))})."
            )
        gpus_per_node = n_gpus // nodes
    if gpus_per_node < 1:
        raise ConfigError(f"gpus_per_node={gpus_per_node}: need at least 1.")
    per_node = min(gpus_per_node, n_gpus)
    if n_gpus % per_node:
        raise ConfigError(
            f"{n_gpus} GPUs do not fill whole nodes of {gpus_per_node}: use a multiple of {gpus_per_node}."
        )
    g = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    if math.isnan(g.intra_node_gbs):
        raise ConfigError(f"GPU {g.name!r} has no intra_node_gbs; build a hardware.GPU with it set.")
    net = network if isinstance(network, Network) else get_network(network)
    return Cluster(n_gpus, per_node, n_gpus // per_node, g, net)


def resolve_cluster(
    cluster: Cluster | None = None,
    n_gpus: int | None = None,
    *,
    gpu: str | GPU | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    network: str | Network | None = None,
) -> Cluster:
    """``cluster`` as given, or :func:`build_cluster` from the other arguments (None: its defaults,
    ``n_gpus=2``). What :func:`estimate_collectives` and :func:`estimate_step` accept.

    Raises ConfigError when ``cluster`` is given together with ``gpu``/``gpus_per_node``/``nodes``/
    ``network`` (the cluster already fixes them) or with an ``n_gpus`` other than ``cluster.n_gpus``,
    when ``cluster`` is not a :class:`Cluster`, and :func:`build_cluster`'s errors.
    """
    if cluster is None:
        extra = {"gpus_per_node": gpus_per_node, "nodes": nodes, "network": network}
        return build_cluster(
            2 if n_gpus is None else n_gpus,
            "H100 SXM" if gpu is None else gpu,
            **{k: v for k, v in extra.items() if v is not None},
        )
    if not isinstance(cluster, Cluster):
        raise ConfigError(
            f"cluster={cluster!r} is not a comm.Cluster: build one with comm.build_cluster(...)."
        )
    given = [
        k
        for k, v in dict(gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes, network=network).items()
        if v is not None
    ]
    if given:
        raise ConfigError(
            f"cluster= and {', '.join(given)}= both given: the cluster already fixes its GPU, nodes and network; "
            f"pass either cluster=build_cluster(n_gpus, gpu, ...) or {', '.join(given)}= without cluster."
        )
    if n_gpus is not None and _count("n_gpus", n_gpus) != cluster.n_gpus:
        raise ConfigError(
            f"n_gpus={n_gpus} but cluster has {cluster.n_gpus} GPUs: drop n_gpus (the cluster sets it) or "
            f"build the cluster with build_cluster({n_gpus}, ...)."
        )
    return cluster


def llama3_70b_config():
    """A Llama-3-70B geometry as a ``LlamaConfig`` (values of meta-llama/Meta-Llama-3-70B config.json:
    hidden 8192, 80 layers, 64 heads, 8 KV heads, MLP 28672, vocab 128256, untied embeddings). No
    download; meta-device counting gives 70,553,706,496 parameters."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip


def unit_sizes(config, group: int, fsdp_version: int = 2, compute_bytes: int = 4, use_orig_params=True):
    """Per FSDP unit (``"root"``, then each decoder layer): (padded numel all-gathered / reduce-scattered,
    real numel). The padding is exact:

    * FSDP1: one FlatParameter per unit; with ``use_orig_params`` each parameter starts at a multiple
      of 16 bytes of the compute dtype, and the total is padded to a multiple of ``group``
      (torch/distributed/fsdp/_flat_param.py, ``_init_flat_param_and_metadata``).
    * FSDP2: each parameter's dim 0 padded to a multiple of ``group`` (``_get_dim0_padded_size``,
      _fsdp_collectives.py ``foreach_all_gather`` / ``foreach_reduce``).
    """
    from smolfsdp.measure.memory import _dim0_layout, _flat_layout, model_units

    out = {}
    for name, params in model_units(config).items():
        real = sum(p.numel for p in params)
        if fsdp_version == 1:
            align = 16 // compute_bytes if use_orig_params else 0
            shard, _ = _flat_layout(params, group, 0, align)
        else:
            shard = sum(_dim0_layout(p, group, 0)[0] for p in params)
        out[name] = (shard * group, real)
    return out


def estimate_collectives(
    model="smollm3-3b",
    *,
    strategy: str = "FULL_SHARD",
    cluster: Cluster | None = None,
    n_gpus: int | None = None,
    gpu: str | GPU | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    network: str | Network | None = None,
    shard_size: int | None = None,
    fsdp_version: int = 2,
    mixed_precision: str = "bf16",
    reduce_dtype: str = "fp32",
    gradient_accumulation_steps: int = 1,
    no_sync: bool = False,
    root_reshard_after_forward: bool | None = None,
    use_orig_params: bool = True,
    include_loop: bool = False,
    latency: bool = True,
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
    not resharded after forward (FSDP1 always keeps it; FSDP2 keeps it only when
    ``reshard_after_forward`` is left unset, and ``smolfsdp.sharding.fsdp2.apply_fsdp2`` sets it, so
    ``root_reshard_after_forward=None`` means False for FSDP1, True for FSDP2). SHARD_GRAD_OP:
    forward all-gathers only. Gradients: one reduce-scatter per unit per micro-batch, or once per step
    with ``no_sync`` (FSDP1 ``no_sync()`` / FSDP2 ``set_requires_gradient_sync(False)``, which keep
    unsharded gradients); HYBRID_SHARD adds an all-reduce of each gradient shard across the
    ``n_gpus / shard_size`` replicas (default shard group: one node). NO_SHARD: DDP all-reduces all
    gradients in 25 MiB buckets (``bucket_cap_mb``), every micro-batch unless ``no_sync``.
    Dtypes: all-gathers in the compute dtype (``mixed_precision`` bf16 -> 2 bytes, "no" -> 4),
    gradient reductions in ``reduce_dtype`` (fp32, as smolfsdp's FSDP1 ``MixedPrecision`` and FSDP2
    ``MixedPrecisionPolicy`` set it; ignored when ``mixed_precision="no"``).
    ``include_loop``: also the small all-reduces ``smolfsdp.train.native``'s loop makes each step (label
    tokens: 1 int64; gradient norm: FSDP1 one fp32, FSDP2 one fp32 per parameter tensor; loss and
    tokens: 2 fp64), for comparing with a trace of that loop.

    Cluster: ``cluster``, or one built from ``n_gpus`` (default 2), ``gpu``, ``gpus_per_node``,
    ``nodes``, ``network`` as :func:`build_cluster` does (:func:`resolve_cluster`).

    Raises ConfigError: unknown strategy/dtype, a shard size that does not divide ``n_gpus``,
    ``gradient_accumulation_steps < 1`` or not whole, fsdp_version not 1 or 2, and
    :func:`resolve_cluster`'s errors (``cluster`` with a different ``n_gpus`` or with ``gpu``/...).
    """
    from smolfsdp.measure.memory import count_parameters, model_units, resolve_model_config

    strategy = ALIASES.get(_strategy(strategy), _strategy(strategy))
    cl = resolve_cluster(cluster, n_gpus, gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes, network=network)
    n = cl.n_gpus
    if fsdp_version not in (1, 2):
        raise ConfigError(f"fsdp_version={fsdp_version}: FSDP is version 1 or 2.")
    if mixed_precision not in ("no", "bf16"):
        raise ConfigError(f"mixed_precision={mixed_precision!r}: use 'no' (fp32) or 'bf16'.")
    if reduce_dtype not in DTYPE_BYTES:
        raise ConfigError(f"reduce_dtype={reduce_dtype!r}: use one of {tuple(DTYPE_BYTES)}.")
    k = _count("gradient_accumulation_steps", gradient_accumulation_steps)
    shard = {"FULL_SHARD": n, "SHARD_GRAD_OP": n, "NO_SHARD": 1}.get(strategy)
    if strategy == "HYBRID_SHARD":
        shard = cl.gpus_per_node if shard_size is None else _count("shard_size", shard_size)
        if n % shard:
            raise ConfigError(
                f"mesh {n // max(shard, 1)} x {shard} does not multiply to {n} GPUs: give a shard_size "
                f"that divides n_gpus (e.g. {cl.gpus_per_node}, one node)."
            )
    replicas = n // shard
    config = resolve_model_config(model)
    c = DTYPE_BYTES["bf16"] if mixed_precision == "bf16" else 4
    r = DTYPE_BYTES[reduce_dtype] if mixed_precision == "bf16" else 4
    rows = []

    def add(unit, phase, kind, group, size, count, numel, real, nbytes):
        if count == 0 or size == 1:
            return
        f = ring_factor(kind, size)
        logical = numel * nbytes
        hops = (2 if kind == "all-reduce" else 1) * (size - 1)
        # ranks r = replica * shard + s: a shard group is contiguous, a replicate group strided by shard
        multi_node = (n if group == "replicate" else size) > cl.gpus_per_node
        hop = RING_HOP_NET_US if multi_node else RING_HOP_NVLINK_US
        lat = (RING_BASE_US + hops * hop) * 1e-6 if latency else 0.0
        bw = cl.network.per_gpu_gbs if multi_node else cl.gpu.intra_node_gbs
        bw = min(bw, cl.gpu.intra_node_gbs)
        sent = f * logical
        rows.append(
            dict(
                unit=unit, phase=phase, kind=kind, group=group, group_size=size, count=count,
                numel=numel, numel_unpadded=real, dtype_bytes=nbytes, logical_bytes=logical,
                in_bytes=logical // size if kind == "all-gather" else logical, sent_bytes=sent,
                received_bytes=sent, link="network" if multi_node else "nvlink", bus_gbs=bw,
                latency_s=lat, time_s=lat + sent / (bw * 1e9),
            )
        )  # fmt: skip

    if strategy == "NO_SHARD":
        total = count_parameters(config).total
        nbytes = total * r
        buckets = max(1, math.ceil(nbytes / DDP_BUCKET_BYTES))
        per = math.ceil(total / buckets)
        add("all", "backward", "all-reduce", "world", n, (1 if no_sync else k) * buckets, per, per, r)
    else:
        sizes = unit_sizes(config, shard, fsdp_version, c, use_orig_params)
        keep_root = root_reshard_after_forward
        keep_root = (fsdp_version == 2) if keep_root is None else keep_root
        reduce_count = 1 if no_sync else k
        for unit, (numel, real) in sizes.items():
            add(unit, "forward", "all-gather", "shard", shard, k, numel, real, c)
            regather = strategy != "SHARD_GRAD_OP" and (unit != "root" or keep_root)
            add(unit, "backward", "all-gather", "shard", shard, k if regather else 0, numel, real, c)
            add(unit, "backward", "reduce-scatter", "shard", shard, reduce_count, numel, real, r)
            add(
                unit,
                "backward",
                "all-reduce",
                "replicate",
                replicas,
                reduce_count,
                numel // shard,
                real // shard,
                r,
            )
    if include_loop:
        n_tensors = sum(len(ps) for ps in model_units(config).values())
        add("loop", "step", "all-reduce", "world", n, 1, 1, 1, 8)  # label tokens, int64
        gn = n_tensors if fsdp_version == 2 and strategy != "NO_SHARD" else 1
        add("loop", "step", "all-reduce", "world", n, 1, gn, gn, 4)  # gradient norm(s), fp32
        add("loop", "step", "all-reduce", "world", n, 1, 2, 2, 8)  # loss and tokens, fp64
    cols = ["unit", "phase", "kind", "group", "group_size", "count", "numel", "numel_unpadded", "dtype_bytes",
            "logical_bytes", "in_bytes", "sent_bytes", "received_bytes", "link", "bus_gbs", "latency_s", "time_s"]  # fmt: skip
    df = pd.DataFrame(rows, columns=cols)
    df.attrs.update(
        strategy=strategy,
        n_gpus=n,
        shard_size=shard,
        replicas=replicas,
        fsdp_version=fsdp_version,
        reductions_per_step=1 if no_sync else k,
    )
    return df


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


# ------------------------------------------------------------------------------ step time
def _flops_per_token(config, seq_len: int) -> float:
    from smolfsdp.measure.benchmark import flops_per_token
    from smolfsdp.measure.memory import count_parameters

    q = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n = count_parameters(config).total
    return flops_per_token(n, config.num_hidden_layers, config.num_attention_heads, int(q), seq_len)


def estimate_step(
    model="smollm3-3b",
    *,
    strategy: str = "FULL_SHARD",
    cluster: Cluster | None = None,
    n_gpus: int | None = None,
    gpu: str | GPU | None = None,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
    network: str | Network | None = None,
    seq_len: int = 4096,
    micro_batch: int = 1,
    gradient_accumulation_steps: int = 1,
    mfu: float = 0.4,
    **kwargs,
) -> dict:
    """Projected time of one optimizer step on one rank, with and without overlap (weak scaling:
    ``micro_batch x seq_len`` tokens per GPU per micro-batch, whatever the GPU count).

    compute: ``tokens x (6N + 12 L H Q T)`` FLOPs (PaLM appendix B, ``smolfsdp.measure.benchmark``) at
    ``mfu`` x the GPU's bf16 dense peak; a third of it is forward, two thirds backward (2N vs 4N).
    comm: the sum of :func:`estimate_collectives` times. Overlap model (PyTorch FSDP paper, sec. 3.3
    and 5.2): forward all-gathers hide behind forward compute, backward all-gathers, reduce-scatters
    and all-reduces behind backward compute, except what nothing can hide: per micro-batch the first
    forward all-gather (nothing to compute yet) and the last gradient collective of the backward (no
    compute left; for HSDP its reduce-scatter and all-reduce; for DDP the last bucket), and the
    loop's collectives. Communication and compute are assumed not to slow each other down.
    ``step_s = sum over phases of exposed + max(compute, comm - exposed)``; ``serial_s = compute +
    comm``; ``efficiency = compute / step_s`` (1.0 when all communication is hidden; weak-scaling
    efficiency against a GPU that only computes). Cluster: ``cluster`` or ``n_gpus`` (default 2),
    ``gpu``, ``gpus_per_node``, ``nodes``, ``network``, as :func:`resolve_cluster` builds it; other
    ``kwargs`` go to :func:`estimate_collectives`. Raises ConfigError for mfu outside (0, 1], sizes
    < 1 or not whole, a sequence longer than the model allows, and :func:`estimate_collectives`'
    errors.
    """
    from smolfsdp.measure.memory import resolve_model_config

    if not 0 < mfu <= 1:
        raise ConfigError(f"mfu={mfu}: give the model FLOP utilisation as a fraction in (0, 1], e.g. 0.4.")
    seq_len, micro_batch = _count("seq_len", seq_len), _count("micro_batch", micro_batch)
    cl = resolve_cluster(cluster, n_gpus, gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes, network=network)
    config = resolve_model_config(model)
    if seq_len > config.max_position_embeddings:
        raise ConfigError(
            f"seq_len={seq_len} is above max_position_embeddings={config.max_position_embeddings}."
        )
    k = _count("gradient_accumulation_steps", gradient_accumulation_steps)
    coll = estimate_collectives(
        config, strategy=strategy, cluster=cl, gradient_accumulation_steps=k, **kwargs
    )
    tokens = micro_batch * seq_len * k
    if math.isnan(cl.gpu.bf16_dense_tflops):
        raise ConfigError(
            f"GPU {cl.gpu.name!r} has no bf16 peak TFLOP/s; pick one from smolfsdp.measure.hardware.GPUS."
        )
    compute = tokens * _flops_per_token(config, seq_len) / (cl.gpu.bf16_dense_tflops * 1e12 * mfu)
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
    # = sum over phases of exposed + max(compute, comm - exposed), written so no comm gives compute exactly
    exposed = first + last + comm_loop + max(0.0, comm_f - first - c_f) + max(0.0, comm_b - last - c_b)
    step = compute + exposed
    comm = comm_f + comm_b + comm_loop
    exposed_min = first + last + comm_loop
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
        "sent_bytes": float((coll["sent_bytes"] * coll["count"]).sum()),
        "logical_bytes": float((coll["logical_bytes"] * coll["count"]).sum()),
    }


# ------------------------------------------------------------------------------ scaling
def recipe_dtypes(recipe: str) -> dict[str, str]:
    """The communication dtypes of a ``smolfsdp.measure.memory.RECIPES`` recipe, as :func:`estimate_collectives`
    takes them: ``mixed_precision`` "bf16" when the recipe computes (so all-gathers) in 2-byte units,
    else "no" (fp32); ``reduce_dtype`` the dtype of its sharded gradient, which FSDP reduce-scatters
    into (``Recipe.grad_bytes``: 4 -> "fp32", 2 -> "bf16"). E.g. "fp32" -> no/fp32, "hf-fsdp-bf16" ->
    bf16/fp32, "pure-bf16" -> bf16/bf16. Raises ConfigError for an unknown recipe (nearest name).
    """
    from smolfsdp.measure.memory import RECIPES, check_choice

    rec = RECIPES[check_choice(recipe, list(RECIPES), "recipe")]
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


def scaling_table(
    models=("smollm3-3b",),
    strategies=STRATEGIES,
    n_gpus=tuple(2**i for i in range(1, 11)),
    *,
    gpu: str = "H100 SXM",
    gpus_per_node: int = 8,
    network: str = "InfiniBand NDR 400 Gb/s",
    recipe: str = "hf-fsdp-bf16",
    activation_checkpointing: bool = True,
    seq_len: int = 4096,
    micro_batch: int = 1,
    mfu: float = 0.4,
    **kwargs,
) -> pd.DataFrame:
    """One row per (model, strategy, GPU count): :func:`estimate_step` plus the per-GPU memory of
    ``smolfsdp.measure.memory.estimate_memory`` (same recipe, sequence, micro-batch, shard group) and whether
    it fits the GPU (``memory_gib``, ``gpu_memory_gib``, ``fits``). Weak scaling: tokens per GPU fixed.
    ``models``: names for ``resolve_model_config`` or configs (e.g. :func:`llama3_70b_config`); a
    single name or config, a single strategy and a single GPU count are taken as one-element lists.
    The recipe sets the communication dtypes too (:func:`recipe_dtypes`: "fp32" all-gathers and
    reduces in fp32); compute time is always at the GPU's bf16 dense peak (the GPU table has no fp32
    figure). Raises ConfigError for ``mixed_precision``/``reduce_dtype`` that contradict the recipe
    (naming the recipes that match), a ``cluster`` (this builds one per GPU count from ``gpu``,
    ``gpus_per_node``, ``network``), and :func:`estimate_step`'s and ``estimate_memory``'s errors.
    """
    from smolfsdp.measure.memory import GIB, RECIPES, estimate_memory, resolve_model_config

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
                    else " (none of smolfsdp.measure.memory.RECIPES does)."
                )
            )
    kwargs = {**kwargs, **dtypes}
    models, strategies, n_gpus = (
        _seq(models, "models"),
        _seq(strategies, "strategies"),
        _seq(n_gpus, "n_gpus"),
    )
    rows = []
    for m in models:
        config = resolve_model_config(m)
        label = m if isinstance(m, str) else getattr(config, "name_or_path", "") or config.model_type
        if not isinstance(m, str) and config.num_hidden_layers == 80 and config.hidden_size == 8192:
            label = "llama-3-70b-like"
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
                    **kwargs,
                )
                mem = estimate_memory(
                    config, world_size=n, strategy=step["strategy"], recipe=recipe, seq_len=seq_len,
                    micro_batch=micro_batch, activation_checkpointing=activation_checkpointing,
                    fsdp_version=kwargs.get("fsdp_version", 2), gpus_per_node=cl.gpus_per_node,
                )  # fmt: skip
                rows.append(
                    {
                        "model": label,
                        **{k: (float(v) if hasattr(v, "dtype") else v) for k, v in step.items()},
                        "memory_gib": mem.peak_bytes / GIB,
                        "gpu_memory_gib": cl.gpu.memory_bytes / GIB,
                        "fits": mem.peak_bytes <= cl.gpu.memory_bytes,
                    }
                )
    df = pd.DataFrame(rows)
    df.attrs["assumptions"] = (
        f"{getattr(gpu, 'name', gpu)}, {gpus_per_node}/node, {getattr(network, 'name', network)}; {recipe} "
        f"({'bf16' if dtypes['mixed_precision'] == 'bf16' else 'fp32'} all-gathers, "
        f"{dtypes['reduce_dtype']} reductions), "
        f"seq {seq_len} x micro-batch {micro_batch} per GPU, "
        f"MFU {mfu:.0%}, activation checkpointing {'on' if activation_checkpointing else 'off'}; "
        "NCCL ring bandwidth and latency, overlap as in comm.estimate_step"
    )
    return df
