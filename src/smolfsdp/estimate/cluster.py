"""A cluster of GPUs and what one collective costs on it (NCCL ring bytes, latency and bandwidth).

Chapter "Scaling out" (``notebooks/07_scaling.ipynb``): ``smolfsdp.estimate.comm`` prices every
collective of a step with :func:`collective_cost` on a :class:`Cluster`; GPU and network figures
come from ``smolfsdp.estimate.hardware``. The keywords that describe a cluster
(:data:`CLUSTER_KEYS`) are listed here once; the estimators accept them and pass them on.

    python -c "from smolfsdp.measure import cluster; print(cluster.build_cluster(16))"

* wire bytes of NCCL's ring algorithms (NCCL ``PERFORMANCE.md``, "bus bandwidth"): all-gather and
  reduce-scatter move ``(n-1)/n * S`` per rank, all-reduce ``2(n-1)/n * S``, S the full size.
* time = latency + wire bytes / bus bandwidth; bandwidth from ``smolfsdp.estimate.hardware`` (NVLink inside a
  node, the network as soon as a group spans nodes).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from smolfsdp.errors import ConfigError, nearest
from smolfsdp.estimate.hardware import GPU, Network, get_gpu, get_network

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "broadcast")
#: NCCL's ring latency model, ``src/graph/tuning.cc`` (NCCL 2.5, 2019): Ring/Simple base latency
#: 8.4 us plus ``nsteps`` hops of 5.7 us (NVLink, one node) or 6.6 us (network, several nodes), with
#: nsteps = n-1 (all-gather, reduce-scatter) or 2(n-1) (all-reduce). Newer NCCL picks tree/PAT
#: algorithms with lower latency at scale, so this is the pessimistic ring figure.
RING_BASE_US, RING_HOP_NVLINK_US, RING_HOP_NET_US = 8.4, 5.7, 6.6
#: The keywords that describe a cluster besides its GPU count, as :func:`build_cluster` takes them;
#: the estimators of ``smolfsdp.estimate.comm`` and ``smolfsdp.estimate.scaling`` accept the same ones.
CLUSTER_KEYS = ("gpu", "gpus_per_node", "nodes", "network")
DEFAULT_GPU, DEFAULT_NETWORK, DEFAULT_N_GPUS = "H100 SXM", "InfiniBand NDR 400 Gb/s", 2


def whole_count(name: str, value, minimum: int = 1) -> int:
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


def collective_cost(cl: Cluster, kind: str, size: int, span: int, logical_bytes: int, latency: bool = True):
    """One collective of ``kind`` over ``size`` ranks whose ranks reach over ``span`` consecutive ranks
    (the group itself when contiguous; the world for a strided group): ``(sent_bytes, link, bus_gbs,
    latency_s, time_s)`` with ``time_s = latency_s + sent_bytes / bus bandwidth`` and the NCCL ring
    latency (:data:`RING_BASE_US` plus one hop per ring step; 0 when ``latency`` is False)."""
    hops = (2 if kind == "all-reduce" else 1) * (size - 1)
    multi_node = span > cl.gpus_per_node
    hop = RING_HOP_NET_US if multi_node else RING_HOP_NVLINK_US
    lat = (RING_BASE_US + hops * hop) * 1e-6 if latency else 0.0
    bw = cl.network.per_gpu_gbs if multi_node else cl.gpu.intra_node_gbs
    bw = min(bw, cl.gpu.intra_node_gbs)
    sent = ring_factor(kind, size) * logical_bytes
    return sent, "network" if multi_node else "nvlink", bw, lat, lat + sent / (bw * 1e9)


def build_cluster(
    n_gpus: int,
    gpu: str | GPU = DEFAULT_GPU,
    *,
    gpus_per_node: int = 8,
    nodes: int | None = None,
    network: str | Network = DEFAULT_NETWORK,
) -> Cluster:
    """A cluster; ``nodes`` (if given) overrides ``gpus_per_node`` as ``n_gpus / nodes``.

    Fewer GPUs than a node holds means one node. Raises ConfigError for ``n_gpus < 1`` or not a whole
    number (likewise ``gpus_per_node``, ``nodes``), a node count that does not divide the GPUs, more
    GPUs than fill whole nodes, an unknown GPU or network (with the nearest names), or a GPU without
    an intra-node bandwidth.
    """
    n_gpus = whole_count("n_gpus", n_gpus)
    gpus_per_node = whole_count("gpus_per_node", gpus_per_node)
    if nodes is not None:
        nodes = whole_count("nodes", nodes)
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


def split_cluster_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """``kwargs`` split into (the :data:`CLUSTER_KEYS` among them, the rest)."""
    spec = {k: v for k, v in kwargs.items() if k in CLUSTER_KEYS}
    return spec, {k: v for k, v in kwargs.items() if k not in CLUSTER_KEYS}


def resolve_cluster(cluster: Cluster | None = None, n_gpus: int | None = None, **spec) -> Cluster:
    """``cluster`` as given, or :func:`build_cluster` from ``n_gpus`` and ``spec`` (keywords of
    :data:`CLUSTER_KEYS`; None or absent: :func:`build_cluster`'s defaults, ``n_gpus=2``). What
    ``comm.estimate_collectives`` and ``scaling.estimate_step`` accept.

    Raises ConfigError for a keyword outside :data:`CLUSTER_KEYS` (with the nearest one), when
    ``cluster`` is given together with ``gpu``/``gpus_per_node``/``nodes``/``network`` (the cluster
    already fixes them) or with an ``n_gpus`` other than ``cluster.n_gpus``, when ``cluster`` is not a
    :class:`Cluster`, and :func:`build_cluster`'s errors.
    """
    unknown = [k for k in spec if k not in CLUSTER_KEYS]
    if unknown:
        hint = nearest(unknown[0], CLUSTER_KEYS)
        raise ConfigError(
            f"unknown keyword {unknown[0]!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f": neither an option of the estimate nor a cluster keyword (n_gpus, {', '.join(CLUSTER_KEYS)})."
        )  # fmt: skip
    given = {k: v for k, v in spec.items() if v is not None}
    if cluster is None:
        gpu = given.pop("gpu", DEFAULT_GPU)
        return build_cluster(DEFAULT_N_GPUS if n_gpus is None else n_gpus, gpu, **given)
    if not isinstance(cluster, Cluster):
        raise ConfigError(
            f"cluster={cluster!r} is not a cluster.Cluster: build one with smolfsdp.estimate.cluster.build_cluster(...)."
        )
    if given:
        names = [k for k in CLUSTER_KEYS if k in given]
        raise ConfigError(
            f"cluster= and {', '.join(names)}= both given: the cluster already fixes its GPU, nodes and network; "
            f"pass either cluster=build_cluster(n_gpus, gpu, ...) or {', '.join(names)}= without cluster."
        )
    if n_gpus is not None and whole_count("n_gpus", n_gpus) != cluster.n_gpus:
        raise ConfigError(
            f"n_gpus={n_gpus} but cluster has {cluster.n_gpus} GPUs: drop n_gpus (the cluster sets it) or "
            f"build the cluster with build_cluster({n_gpus}, ...)."
        )
    return cluster
