"""GPUs and the "Does FSDP fit?" decision (chapter "Where the memory goes").

A small table of data-centre GPUs with the figures their vendor datasheets state, a fit verdict
per GPU for an estimate from ``smolfsdp.measure.memory``, and ``recommend``: the seed's "Does FSDP fit?"
flowchart as a function that reaches for the cheap levers first (activation checkpointing, then a
smaller micro-batch, then more sharding, then CPU offload, then more GPUs) and says what the one it
chose costs.

    smolfsdp memory --model smollm3-3b --gpus 2 --gpu A10G
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from smolfsdp.config import ConfigError, nearest
from smolfsdp.measure.memory import GIB, estimate_memory


@dataclass(frozen=True)
class GPU:
    """Datasheet figures. ``memory_gb`` is the datasheet's GB, read as 10**9 bytes (conservative: the
    capacity torch reports is usually a little higher for HBM parts, and what a process can use is
    lower: CUDA context, allocator fragmentation). TFLOP/s are dense (no 2:4 sparsity)."""

    name: str
    memory_gb: float
    bf16_dense_tflops: float
    hbm_bandwidth_gbs: float  # GB/s
    interconnect: str
    source: str
    #: GPU-to-GPU bandwidth inside a node, GB/s per direction per GPU (half the datasheet's
    #: bidirectional NVLink or PCIe figure); NaN when unknown. Used by ``smolfsdp.measure.comm``.
    intra_node_gbs: float = float("nan")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU("A10G", 24, 125, 600, "PCIe Gen4 x16 (64 GB/s)",
            "NVIDIA A10 datasheet (A10G is AWS's A10 variant; AWS publishes no separate tensor figure)", 32),
        GPU("L4", 24, 121, 300, "PCIe Gen4 x16 (64 GB/s)", "NVIDIA L4 Tensor Core GPU datasheet", 32),
        GPU("L40S", 48, 362, 864, "PCIe Gen4 x16 (64 GB/s)", "NVIDIA L40S datasheet", 32),
        GPU("A100 40GB", 40, 312, 1555, "NVLink 3 (600 GB/s)", "NVIDIA A100 Tensor Core GPU datasheet (SXM)", 300),
        GPU("A100 80GB", 80, 312, 2039, "NVLink 3 (600 GB/s)", "NVIDIA A100 Tensor Core GPU datasheet (SXM)", 300),
        GPU("H100 SXM", 80, 989, 3350, "NVLink 4 (900 GB/s)", "NVIDIA H100 Tensor Core GPU datasheet (SXM)", 450),
        GPU("H200", 141, 989, 4800, "NVLink 4 (900 GB/s)", "NVIDIA H200 Tensor Core GPU datasheet (SXM)", 450),
        # The same datasheet's H200 NVL column (PCIe card, 600 W): BF16 1,671 TFLOPS with sparsity, so 835.5
        # dense; 141 GB at 4.8 TB/s; 2- or 4-way NVLink bridge 900 GB/s per GPU, PCIe Gen5 128 GB/s.
        GPU("H200 NVL", 141, 835.5, 4800, "NVLink bridge, 2- or 4-way (900 GB/s); PCIe Gen5 (128 GB/s)",
            "NVIDIA H200 Tensor Core GPU datasheet (NVL)", 450),
    )
}  # fmt: skip

#: Substring of ``torch.cuda.get_device_name`` (upper case) -> key of ``GPUS``, first match wins; None: a
#: variant the table does not hold, so its peak is unknown rather than another variant's. SXM parts
#: report "NVIDIA H200" and "NVIDIA H100 80GB HBM3"; the PCIe cards "NVIDIA H200 NVL", "NVIDIA H100 NVL",
#: "NVIDIA H100 PCIe" (NVL and PCIe run at lower clocks and power: H100 NVL 1,671 and H100 PCIe 1,513
#: BF16 TFLOPS with sparsity, against 1,979 for SXM; NVIDIA H100 Tensor Core GPU datasheet).
DEVICE_NAMES = (
    ("H200 NVL", "H200 NVL"),
    ("H200", "H200"),
    ("H100 NVL", None),
    ("H100 PCIE", None),
    ("H100", "H100 SXM"),
    ("A100-SXM4-80GB", "A100 80GB"),
    ("A100 80GB", "A100 80GB"),
    ("A100", "A100 40GB"),
    ("L40S", "L40S"),
    ("L4", "L4"),
    ("A10G", "A10G"),
)


def gpu_from_device_name(device_name: str | None) -> GPU | None:
    """The ``GPUS`` entry for a name as ``torch.cuda.get_device_name`` gives it ("NVIDIA H200 NVL"),
    or None for a CPU (``None``), a GPU not in the table, or a variant of a listed GPU that the table
    does not hold (an H100 NVL is not scored as an H100 SXM). Never raises."""
    upper = str(device_name or "").upper()
    for needle, key in DEVICE_NAMES if upper else ():
        if needle in upper:
            return GPUS[key] if key else None
    return None


@dataclass(frozen=True)
class Network:
    """A node-to-node fabric, as bandwidth per GPU per direction (GB/s): one NIC's line rate when
    each GPU has its own NIC (rail-optimised clusters), else the node's rate over its GPUs."""

    name: str
    per_gpu_gbs: float
    source: str


NETWORKS: dict[str, Network] = {
    n.name: n
    for n in (
        Network("InfiniBand NDR 400 Gb/s", 50.0,
                "one ConnectX-7 400 Gb/s NIC per GPU (NVIDIA DGX H100 user guide: 8 x 400 Gb/s); 400/8 = 50 GB/s"),
        Network("InfiniBand HDR 200 Gb/s", 25.0,
                "one ConnectX-6 200 Gb/s NIC per GPU (NVIDIA DGX A100 user guide: 8 x 200 Gb/s); 200/8 = 25 GB/s"),
        Network("AWS EFA p5 3200 Gb/s", 50.0,
                "p5.48xlarge: 3200 Gbps EFA over 8 H100 (AWS EC2 P5 instance page); 3200/8/8 = 50 GB/s"),
        Network("AWS EFA p4d 400 Gb/s", 6.25,
                "p4d.24xlarge: 400 Gbps EFA over 8 A100 (AWS EC2 P4 instance page); 400/8/8 = 6.25 GB/s"),
    )
}  # fmt: skip


def _compact(name) -> str:
    """Lower case without spaces, dashes or underscores: 'H100-SXM' and 'h100sxm' both give 'h100sxm'."""
    return "".join(ch for ch in str(name).lower() if ch not in " -_")


def _did_you_mean(name, options) -> str:
    """' (did you mean 'A' or 'B'?)': the known names that start with, then contain, ``name`` (so 'a100'
    points at both A100s, not at 'A10G'); else the nearest spelling (``config.nearest``); else ''."""
    q = _compact(name)
    hits = [o for o in options if q and _compact(o).startswith(q)]
    hits += [o for o in options if q and q in _compact(o) and o not in hits]
    hits = hits or nearest(str(name), options)
    return f" (did you mean {' or '.join(repr(h) for h in hits)}?)" if hits else ""


def get_network(name: str) -> Network:
    """A fabric from ``NETWORKS`` (case, spaces, dashes and underscores ignored). Raises ConfigError
    naming the known fabrics that start with or contain ``name``, else the nearest spelling."""
    if isinstance(name, Network):
        return name
    by_key = {_compact(k): n for k, n in NETWORKS.items()}
    if _compact(name) in by_key:
        return by_key[_compact(name)]
    raise ConfigError(
        f"Unknown network {name!r}"
        + _did_you_mean(name, NETWORKS)
        + f". Known: {', '.join(NETWORKS)}; or build a smolfsdp.measure.hardware.Network(name, per_gpu_gbs, source)."
    )


def get_gpu(name: str | None = None, memory_gib: float | None = None) -> GPU:
    """A GPU from the table (case-insensitive), or a custom one of ``memory_gib`` GiB.

    Names match ignoring case, spaces, dashes and underscores ('h100-sxm', 'H100SXM'). Raises
    ConfigError for an unknown name, listing the known ones and suggesting those that start with or
    contain it ('a100' -> 'A100 40GB' or 'A100 80GB'), else the nearest spelling.
    """
    if memory_gib is not None:
        if memory_gib <= 0:
            raise ConfigError(f"gpu memory {memory_gib} GiB: give a positive size.")
        label = name or f"custom {memory_gib:g} GiB"
        return GPU(
            label,
            memory_gib * 2**30 / 1e9,
            float("nan"),
            float("nan"),
            "unknown",
            "given on the command line",
        )
    if isinstance(name, GPU):
        return name
    by_key = {_compact(k): g for k, g in GPUS.items()}
    if _compact(name) in by_key:
        return by_key[_compact(name)]
    raise ConfigError(
        f"Unknown GPU {name!r}"
        + _did_you_mean(name, GPUS)
        + f". Known: {', '.join(GPUS)}; or give its memory with --gpu-memory-gib."
    )


def fits(estimate, gpu: GPU) -> bool:
    """True when the estimate's device peak (upper bound) is within the GPU's memory."""
    return estimate.peak_bytes <= gpu.memory_bytes


def fit_table(estimates: dict[str, object], gpus=None):
    """Rows of (setting, GPU, peak GiB, memory GiB, fits) for each named estimate and GPU."""
    import pandas as pd

    rows = []
    for label, est in estimates.items():
        for g in gpus or GPUS.values():
            rows.append(
                {
                    "setting": label,
                    "gpu": g.name,
                    "peak_gib": est.peak_bytes / 2**30,
                    "gpu_memory_gib": g.memory_bytes / 2**30,
                    "fits": fits(est, g),
                }
            )
    return pd.DataFrame(rows)


#: The levers of "Does FSDP fit?", cheapest first, and what each costs. Cost order: activation
#: checkpointing costs compute on the GPU alone; a smaller micro-batch keeps the math but runs smaller
#: kernels and repeats FSDP's collectives per micro-batch; more sharding adds communication; CPU offload
#: puts the state behind PCIe and the optimizer step on the CPU. Each is ranked above all cheaper ones
#: together (weights 1, 2, 4, 8), so a set of cheap levers is tried before one dearer lever.
LEVERS = ("activation checkpointing", "micro-batch", "sharding", "CPU offload")
LEVER_COSTS = {
    "activation checkpointing": "recomputes each decoder layer's forward during backward: about one extra "
    "forward pass, ~33% more compute per step (a forward is ~1/3 of forward + backward)",
    "micro-batch": "fewer sequences per forward with gradient accumulation to keep the global batch: the same "
    "math in smaller kernels (lower GPU utilisation), and FSDP's all-gathers and reduce-scatters run once per "
    "micro-batch",
    "sharding": "more communication: SHARD_GRAD_OP sends about what DDP does (all-gather + reduce-scatter, "
    "2x the parameter bytes per step); FULL_SHARD all-gathers again in backward (3x, ~1.5x DDP's traffic)",
    "CPU offload": "parameters, gradients and optimizer state live in host memory: every step moves them over "
    "PCIe and the optimizer step runs on the CPU (often several times slower per step)",
    "more GPUs": "more hardware, and collectives over more ranks",
}
#: What the sharding lever costs, by the strategy it reached (ring collectives: an all-reduce moves ~2x
#: the bytes, an all-gather or a reduce-scatter ~1x; ZeRO paper, Rajbhandari et al. 2020, sec. 7).
SHARDING_COSTS = {
    "SHARD_GRAD_OP": "parameters all-gathered once per step and gradients reduce-scattered: about the "
    "traffic of DDP's all-reduce (2x the parameter bytes per step), and the gathered units stay in memory "
    "from forward to backward",
    "FULL_SHARD": "parameters all-gathered in forward and again in backward, gradients reduce-scattered: 3x "
    "the parameter bytes per step, ~1.5x DDP's traffic (hidden behind compute when prefetch keeps up)",
}


@dataclass
class Recommendation:
    """The answer of ``recommend``.

    ``decision``: the configuration, e.g. "FULL_SHARD + activation checkpointing" ("full replica" for
    NO_SHARD, "does not fit" when nothing does); ``lever``: the dearest lever used (a name of ``LEVERS``,
    "more GPUs", "none" when the configuration fits as given, "does not fit"); ``levers``: every lever
    used, cheapest first; ``cost``: what ``lever`` costs, in words; ``gpus``: the world size;
    ``estimate``: the ``MemoryEstimate`` of the decision (of the most relieved try for "does not fit");
    ``reason``: what was evaluated (FSDP version, strategy, recipe, sequence, GPU) with the peak against
    the GPU's memory; then, on indented lines, the lever and its cost, and what the cheaper tries
    peaked at.
    """

    decision: str
    gpus: int
    estimate: object
    reason: str
    lever: str = "none"
    levers: tuple[str, ...] = ()
    cost: str = ""
    tried: list[tuple[str, int]] = field(default_factory=list)  # (configuration, peak bytes), in order


def _label(est, levers: dict) -> str:
    """The configuration of ``est`` as a reader says it: 'FULL_SHARD + activation checkpointing +
    micro-batch 1 (x4 accumulation)' ('full replica' for NO_SHARD)."""
    parts = ["full replica" if est.strategy == "NO_SHARD" else est.strategy]
    if est.activation_checkpointing:
        parts.append("activation checkpointing")
    if "micro-batch" in levers:
        mb, accum = levers["micro-batch"]
        parts.append(f"micro-batch {mb} (x{accum} accumulation)")
    if est.offload:
        parts.append("CPU offload")
    return " + ".join(parts)


def _sharding_steps(strategy: str, gpus: int) -> list[str]:
    """Strategies shard more than ``strategy`` on ``gpus`` GPUs, least first."""
    if gpus < 2 or strategy == "FULL_SHARD":
        return []
    return ["SHARD_GRAD_OP", "FULL_SHARD"] if strategy == "NO_SHARD" else ["FULL_SHARD"]


def _lever_sets(available: list[str]):
    """Subsets of the available levers, cheapest first: ordered as binary numbers with each lever's bit
    worth more than all cheaper ones together, so {AC, micro-batch} comes before {sharding}. Where
    sharding is available, CPU offload comes only with it: offloading a replica keeps a whole copy per
    rank on the host and moves all of it over PCIe every step; FSDP offloads the shards."""
    weight = {lever: 2**i for i, lever in enumerate(LEVERS)}
    sets = [c for n in range(1, len(available) + 1) for c in itertools.combinations(available, n)]
    if "sharding" in available:
        sets = [c for c in sets if "CPU offload" not in c or "sharding" in c]
    return sorted(sets, key=lambda c: sum(weight[lever] for lever in c))


def _try(model, g: GPU, gpus: int, base: dict, chosen: tuple[str, ...]):
    """The configurations the levers in ``chosen`` allow, least change first: the first that fits (else the
    most relieved one), its levers ({lever: True, "micro-batch": (micro-batch, accumulation steps)}) and
    the ``estimate_memory`` arguments it used. A micro-batch lever halves the micro-batch (down to 1)
    until it fits; sharding goes to SHARD_GRAD_OP before FULL_SHARD."""
    strategies = _sharding_steps(base["strategy"], gpus) if "sharding" in chosen else [base["strategy"]]
    mbs, mb = [], base["micro_batch"]
    while "micro-batch" in chosen and mb > 1:
        mb = max(1, mb // 2)
        mbs.append(mb)
    est, levers, kw = None, {}, {}
    for strategy, micro_batch in itertools.product(strategies, mbs or [base["micro_batch"]]):
        kw = {**base, "strategy": strategy, "micro_batch": micro_batch, "world_size": gpus}
        kw["activation_checkpointing"] = (
            base["activation_checkpointing"] or "activation checkpointing" in chosen
        )
        kw["offload"] = base["offload"] or "CPU offload" in chosen
        est = estimate_memory(model, **kw)
        levers = {lever: True for lever in chosen}
        if mbs:
            levers["micro-batch"] = (micro_batch, -(-base["micro_batch"] // micro_batch))
        if fits(est, g):
            break
    return est, levers, kw


def _describe(est, g: GPU, gpus: int) -> str:
    """'FSDP1 FULL_SHARD, recipe hf-fsdp-bf16, seq 4096 x micro-batch 1, 2 x A100 40GB: peak 30.9 of
    37.3 GiB': what was evaluated, and its device peak against the GPU's memory (GiB = 2**30 bytes)."""
    return (
        f"FSDP{est.fsdp_version} {est.strategy}, recipe {est.recipe}, seq {est.seq_len} x micro-batch "
        f"{est.micro_batch}{', LoRA' if est.lora else ''}, {gpus} x {g.name}: peak "
        f"{est.peak_bytes / GIB:.1f} of {g.memory_bytes / GIB:.1f} GiB"
    )


def _cost(lever: str, model, kw: dict) -> str:
    """``LEVER_COSTS[lever]``; for CPU offload with the PCIe bytes per GPU per step: the parameter shard up
    for forward and again for backward, the gradient shard down (FSDP1 ``CPUOffload`` and FSDP2
    ``CPUOffloadPolicy`` copy them every step), read from the same settings without offload."""
    if lever == "sharding":
        return SHARDING_COSTS[kw["strategy"]]
    if lever != "CPU offload":
        return LEVER_COSTS.get(lever, "")
    device = estimate_memory(model, **{**kw, "offload": False})
    pcie = 2 * device.params_bytes + device.grads_bytes
    return f"{LEVER_COSTS[lever]}; here ~{pcie / GIB:.1f} GiB over PCIe per GPU per step"


def recommend(
    model="smollm3-3b",
    gpu: GPU | str = "H100 SXM",
    gpus: int = 1,
    *,
    strategy: str = "NO_SHARD",
    micro_batch: int = 1,
    activation_checkpointing: bool = False,
    offload: bool = False,
    host_memory_gib: float | None = None,
    max_gpus: int = 1024,
    **kwargs,
) -> Recommendation:
    """The "Does FSDP fit?" flowchart for ``gpus`` GPUs of one kind, cheapest lever first.

    Starts from the configuration given (``strategy``, default NO_SHARD: a full replica per GPU, so the
    first question is whether FSDP is needed at all; ``micro_batch``; ``activation_checkpointing``;
    ``offload``; ``kwargs`` such as ``recipe``, ``seq_len``, ``lora``, ``fsdp_version`` go to
    ``estimate_memory`` unchanged). If it does not fit, tries the levers not already in use, alone and
    together, in ``_lever_sets`` order: activation checkpointing, a smaller micro-batch (halved down to 1,
    gradient accumulation keeping the global batch), more sharding (SHARD_GRAD_OP, then FULL_SHARD; needs
    2+ GPUs), CPU offload (only where ``host_memory_gib`` per node, if given, holds the offloaded state
    of ``min(gpus, gpus_per_node)`` ranks). Then the smallest power-of-two world size up to ``max_gpus``
    where FULL_SHARD fits without offload (with activation checkpointing and micro-batch 1 if needed).

    Guarantee (``tests/test_hardware.py`` checks it on a grid): when the answer uses lever L, no cheaper
    lever, alone or with other cheaper ones, fits per ``estimate_memory``, and the answer's estimate fits.
    Raises ConfigError for an unknown GPU or bad estimator arguments.
    """
    g = gpu if isinstance(gpu, GPU) else get_gpu(gpu)
    kwargs = {k: v for k, v in kwargs.items() if k != "world_size"}
    base = dict(kwargs, strategy=strategy, micro_batch=micro_batch, offload=offload)
    base["activation_checkpointing"] = activation_checkpointing
    per_node = min(gpus, kwargs.get("gpus_per_node", 8))
    est, _, kw = _try(model, g, gpus, base, ())
    tried = [(_label(est, {}), est.peak_bytes)]
    if fits(est, g):
        return Recommendation(
            tried[0][0], gpus, est, "fits as given: " + _describe(est, g, gpus), tried=tried
        )
    free = {
        "activation checkpointing": not activation_checkpointing,
        "micro-batch": micro_batch > 1,
        "sharding": bool(_sharding_steps(strategy, gpus)),
        "CPU offload": not offload,
    }
    available = [lever for lever in LEVERS if free[lever]]
    for chosen in _lever_sets(available):
        est, levers, kw = _try(model, g, gpus, base, chosen)
        label = _label(est, levers)
        host_ok = (
            not est.offload or host_memory_gib is None or est.host_bytes * per_node <= host_memory_gib * GIB
        )
        tried.append((label, est.peak_bytes))
        if fits(est, g) and host_ok:
            lever = chosen[-1]
            cost = _cost(lever, model, kw)
            cheaper = "; ".join(f"{c} {b / GIB:.1f} GiB" for c, b in tried[:-1])
            reason = f"{_describe(est, g, gpus)}\n  lever: {lever}; cost: {cost}\n  tried first, did not fit: {cheaper}"
            return Recommendation(label, gpus, est, reason, lever, chosen, cost, tried)
    return _more_gpus(model, g, gpus, base, max_gpus, tried, est)


def _more_gpus(model, g: GPU, gpus: int, base: dict, max_gpus: int, tried: list, last) -> Recommendation:
    """The last resort of ``recommend``: FULL_SHARD over more GPUs (no offload), else "does not fit"."""
    base = dict(base, strategy="FULL_SHARD", offload=False)
    n = gpus
    while n < max_gpus:
        n *= 2
        for chosen in [
            (),
            *_lever_sets([lv for lv in LEVERS[:2] if lv != "micro-batch" or base["micro_batch"] > 1]),
        ]:
            est, levers, _ = _try(model, g, n, base, chosen)
            if fits(est, g):
                cost = LEVER_COSTS["more GPUs"]
                reason = f"{_describe(est, g, n)}\n  lever: more GPUs; cost: {cost}; nothing fits on {gpus}"
                levers_used = (*chosen, "more GPUs")
                return Recommendation(
                    _label(est, levers), n, est, reason, "more GPUs", levers_used, cost, tried
                )
    reason = (
        f"nothing fits on up to {max_gpus} x {g.name}: activations and gathered units alone exceed the GPU "
        f"({_describe(last, g, gpus)}); use a shorter sequence"
    )
    return Recommendation("does not fit", gpus, last, reason, "does not fit", (), "", tried)
