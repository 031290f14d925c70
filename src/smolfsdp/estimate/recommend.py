"""The "Does FSDP fit?" decision (chapter "Where the memory goes").

``recommend``: the seed's "Does FSDP fit?" flowchart as a function that reaches for the cheap levers
first (activation checkpointing, then a smaller micro-batch, then more sharding, then CPU offload, then
more GPUs), each checked with ``smolfsdp.estimate.memory.estimate_memory`` and judged by the one fit verdict
(``smolfsdp.estimate.hardware.fit_verdict``), and says what the one it chose costs. Only ``fits`` is accepted:
a setting that is ``tight`` (its tensors fit but not the allocator's reserved memory, so the allocator would
have to release its cache and retry, slower and still at risk of fragmentation) is not an answer, and the
search goes on to the next lever; the reason text names the tight tries with their numbers.

    smolfsdp memory --model smollm3-3b --gpus 2 --gpu A10G
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from smolfsdp.estimate.hardware import GPU, FitVerdict, fit_verdict, get_gpu
from smolfsdp.estimate.memory import estimate_memory
from smolfsdp.estimate.params import LoraSpec
from smolfsdp.estimate.recipes import GIB
from smolfsdp.estimate.recompute import recompute_words

#: The levers of "Does FSDP fit?", cheapest first, and what each costs. Cost order: activation
#: checkpointing costs compute on the GPU alone; a smaller micro-batch keeps the math but runs smaller
#: kernels and repeats FSDP's collectives per micro-batch; more sharding adds communication; CPU offload
#: puts the state behind PCIe and the optimizer step on the CPU. Each is ranked above all cheaper ones
#: together (weights 1, 2, 4, 8), so a set of cheap levers is tried before one dearer lever.
LEVERS = ("activation checkpointing", "micro-batch", "sharding", "CPU offload")
LEVER_COSTS = {
    "activation checkpointing": "recomputes each decoder layer's forward during backward (less than a whole "
    "forward: torch stops before the last matmul; the share for the model is computed by "
    "smolfsdp.estimate.recompute)",
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
    ``fit``: its verdict on the GPU (``hardware.fit_verdict``: "fits" for every answer, "tight" or "does not
    fit" for "does not fit"); ``reason``: what was evaluated (FSDP version, strategy, recipe, sequence, GPU)
    with the verdict's line (need, tensor peak, card); then, on indented lines, the lever and its cost, and the
    cheaper tries with their verdicts; ``tried``: (configuration, verdict) in the order tried.
    """

    decision: str
    gpus: int
    estimate: object
    reason: str
    lever: str = "none"
    levers: tuple[str, ...] = ()
    cost: str = ""
    tried: list[tuple[str, FitVerdict]] = field(default_factory=list)
    fit: FitVerdict | None = None


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


def _try(model, g: GPU, gpus: int, base: dict, chosen: tuple[str, ...], tried: list | None = None):
    """The configurations the levers in ``chosen`` allow, least change first: the first that fits (else the
    most relieved one), its levers ({lever: True, "micro-batch": (micro-batch, accumulation steps)}) and
    the ``estimate_memory`` arguments it used. A micro-batch lever halves the micro-batch (down to 1)
    until it fits; sharding goes to SHARD_GRAD_OP before FULL_SHARD. Each configuration evaluated is appended
    to ``tried`` (when given) as (label, verdict)."""
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
        fit = fit_verdict(est, g)
        if tried is not None:
            tried.append((_label(est, levers), fit))
        if fit.fits:
            break
    return est, levers, kw


def _describe(est, g: GPU, gpus: int) -> str:
    """'FSDP1 FULL_SHARD, recipe hf-fsdp-bf16, seq 4096 x micro-batch 1, 2 x A100 40GB: fits: needs 35.1 GiB
    reserved (tensor peak 29.4) of 37.3 GiB': what was evaluated and its verdict's line
    (``hardware.format_fit``; GiB = 2**30 bytes)."""
    return (
        f"FSDP{est.fsdp_version} {est.strategy}, recipe {est.recipe}, seq {est.seq_len} x micro-batch "
        f"{est.micro_batch}{', LoRA' if est.lora else ''}, {gpus} x {g.name}: {fit_verdict(est, g).line}"
    )


def _tried_text(tried: list) -> str:
    """The cheaper tries, each with its verdict: 'full replica + activation checkpointing: does not fit: needs
    64.0 GiB reserved (tensor peak 57.9) of 37.3 GiB; ...'."""
    return "; ".join(f"{label}: {v.line}" for label, v in tried)


def _cost(lever: str, model, kw: dict, g: GPU) -> str:
    """``LEVER_COSTS[lever]``; for CPU offload with the PCIe bytes per GPU per step: the parameter shard up
    for forward and again for backward, the gradient shard down (FSDP1 ``CPUOffload`` and FSDP2
    ``CPUOffloadPolicy`` copy them every step), read from the same settings without offload."""
    if lever == "sharding":
        return SHARDING_COSTS[kw["strategy"]]
    if lever == "activation checkpointing":
        return _recompute_cost(model, kw, g)
    if lever != "CPU offload":
        return LEVER_COSTS.get(lever, "")
    device = estimate_memory(model, **{**kw, "offload": False})
    pcie = 2 * device.params_bytes + device.grads_bytes
    return f"{LEVER_COSTS[lever]}; here ~{pcie / GIB:.1f} GiB over PCIe per GPU per step"


#: Selective modes the activation-checkpointing lever also tries, least recomputation first (torchtitan's
#: op-level policy, then every 2nd layer; ``smolfsdp.ac_options``); they run on the native engine only.
SELECTIVE = (("op", None), ("layer", 2))


def _recompute_cost(model, kw: dict, g: GPU) -> str:
    """The AC lever's cost for these settings: what full checkpointing recomputes (FLOPs counted by
    ``smolfsdp.estimate.recompute``), and the selective mode of :data:`SELECTIVE` that recomputes least
    while still fitting, when one does."""
    lora = kw.get("lora")
    spec = LoraSpec() if lora is True else (lora or None)
    seq = kw.get("seq_len", 2048)
    words = recompute_words(model, "full", None, seq_len=seq, lora=spec)
    for mode, every in SELECTIVE:
        est = estimate_memory(model, **{**kw, "ac_mode": mode, "ac_every": every})
        if fit_verdict(est, g).fits:
            name = "op-level selective" if mode == "op" else f"every {every}nd layer"
            less = recompute_words(model, mode, every, seq_len=seq, lora=spec, why=False)
            return (
                f"{words}. Selective checkpointing also fits ({name}: ac_mode: {mode}"
                f"{f', ac_every: {every}' if every else ''}, native engine; {fit_verdict(est, g).line}) "
                f"and {less}"
            )
    return words


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
    tried = []
    est, _, kw = _try(model, g, gpus, base, (), tried)
    if tried[0][1].fits:
        reason = "fits as given: " + _describe(est, g, gpus)
        return Recommendation(tried[0][0], gpus, est, reason, tried=tried, fit=tried[0][1])
    free = {
        "activation checkpointing": not activation_checkpointing,
        "micro-batch": micro_batch > 1,
        "sharding": bool(_sharding_steps(strategy, gpus)),
        "CPU offload": not offload,
    }
    available = [lever for lever in LEVERS if free[lever]]
    for chosen in _lever_sets(available):
        est, levers, kw = _try(model, g, gpus, base, chosen, tried)
        label = _label(est, levers)
        host_ok = (
            not est.offload or host_memory_gib is None or est.host_bytes * per_node <= host_memory_gib * GIB
        )
        if tried[-1][1].fits and host_ok:
            lever = chosen[-1]
            cost = _cost(lever, model, kw, g)
            cheaper = _tried_text(tried[:-1])
            reason = f"{_describe(est, g, gpus)}\n  lever: {lever}; cost: {cost}\n  tried first: {cheaper}"
            reason += _least_sharding(model, kw, est, g)
            return Recommendation(label, gpus, est, reason, lever, chosen, cost, tried, tried[-1][1])
    return _more_gpus(model, g, gpus, base, max_gpus, tried, est)


def _least_sharding(model, kw: dict, est, g: GPU) -> str:
    """Why SHARD_GRAD_OP was chosen where FULL_SHARD needs less (both fit): it communicates less.
    Empty for any other choice."""
    if kw.get("strategy") != "SHARD_GRAD_OP":
        return ""
    full = estimate_memory(model, **{**kw, "strategy": "FULL_SHARD"})
    if full.device_need_bytes >= est.device_need_bytes:
        return ""
    return (
        f"\n  SHARD_GRAD_OP rather than FULL_SHARD: FULL_SHARD would need less ({fit_verdict(full, g).line}), "
        "but both fit and SHARD_GRAD_OP moves less data (no second all-gather in backward: 2x instead of 3x "
        "the parameter bytes per step), so the least sharding that fits is recommended"
    )


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
            fit = fit_verdict(est, g)
            if fit.fits:
                cost = LEVER_COSTS["more GPUs"]
                reason = f"{_describe(est, g, n)}\n  lever: more GPUs; cost: {cost}; nothing fits on {gpus}"
                levers_used = (*chosen, "more GPUs")
                return Recommendation(
                    _label(est, levers), n, est, reason, "more GPUs", levers_used, cost, tried, fit
                )
    reason = (
        f"nothing fits on up to {max_gpus} x {g.name}: activations and gathered units alone exceed the GPU "
        f"({_describe(last, g, gpus)}); use a shorter sequence"
    )
    return Recommendation(
        "does not fit", gpus, last, reason, "does not fit", (), "", tried, fit_verdict(last, g)
    )
