"""GPUs and networks (chapter "Where the memory goes").

A small table of data-centre GPUs with the figures their vendor datasheets state, and the one fit verdict
(``verdict`` / ``fit_verdict``: fits, tight or does not fit, with the numbers it rests on, printed by
``format_fit``) per GPU for an estimate from ``smolfsdp.estimate.memory``: every page, table and command that
says whether a setting fits asks it. The "Does FSDP fit?" decision built on it is
``smolfsdp.estimate.recommend``.

    smolfsdp memory --model smollm3-3b --gpus 2 --gpu A10G
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smolfsdp.errors import ConfigError, did_you_mean


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
    #: bidirectional NVLink or PCIe figure); NaN when unknown. Used by ``smolfsdp.estimate.comm``.
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
    points at both A100s, not at 'A10G'); else the nearest spelling (``errors.did_you_mean``); else ''."""
    q = _compact(name)
    hits = [o for o in options if q and _compact(o).startswith(q)]
    hits += [o for o in options if q and q in _compact(o) and o not in hits]
    return did_you_mean(str(name), options, form=" (did you mean {}?)", hits=hits or None)


def _lookup(table: dict, name, kind: str, otherwise: str):
    """``table``'s entry for ``name`` (case, spaces, dashes and underscores ignored); ConfigError naming
    the known entries, a did-you-mean, and ``otherwise`` (what to do for one not in the table)."""
    by_key = {_compact(k): v for k, v in table.items()}
    if _compact(name) in by_key:
        return by_key[_compact(name)]
    raise ConfigError(
        f"Unknown {kind} {name!r}{_did_you_mean(name, table)}. Known: {', '.join(table)}; {otherwise}."
    )


def get_network(name: str) -> Network:
    """A fabric from ``NETWORKS`` (case, spaces, dashes and underscores ignored). Raises ConfigError
    naming the known fabrics that start with or contain ``name``, else the nearest spelling."""
    if isinstance(name, Network):
        return name
    return _lookup(
        NETWORKS, name, "network", "or build a smolfsdp.estimate.hardware.Network(name, per_gpu_gbs, source)"
    )


def get_gpu(name: str | None = None, memory_gib: float | None = None) -> GPU:
    """A GPU from the table (case-insensitive), or a custom one of ``memory_gib`` GiB.

    Names match ignoring case, spaces, dashes and underscores ('h100-sxm', 'H100SXM'). Raises
    ConfigError for an unknown name, listing the known ones and suggesting those that start with or
    contain it ('a100' -> 'A100 40GB' or 'A100 80GB'), else the nearest spelling; and a ``memory_gib`` that
    is not a positive, finite number (nan and inf would fail only where the verdict converts it to bytes).
    """
    if memory_gib is not None:
        if not math.isfinite(memory_gib) or memory_gib <= 0:
            raise ConfigError(
                f"--gpu-memory-gib {memory_gib:g}: give the GPU's memory as a positive, finite number of GiB "
                "(e.g. --gpu-memory-gib 80)."
            )
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
    return _lookup(GPUS, name, "GPU", "or give its memory with --gpu-memory-gib")


#: The three fit words, best first (``verdict``; palette.VERDICT colours them in the book's figures).
VERDICTS = ("fits", "tight", "does not fit")


def verdict_word(need_bytes: int, peak_bytes: int, gpu_bytes: int) -> str:
    """The fit rule on bytes, the one every verdict of the package uses (and the fit explorer's script copies):
    ``fits`` when ``need_bytes`` (reserved memory + CUDA context + NCCL, ``MemoryEstimate.device_need_bytes``)
    is within ``gpu_bytes``; ``tight`` when only ``peak_bytes`` (the tensor peak + CUDA context + NCCL,
    ``MemoryEstimate.peak_bytes``) is: the caching allocator must release cached blocks and retry (its
    ``num_alloc_retries`` counter; slower, and fragmentation can still fail it: torch.cuda.memory_stats docs);
    else ``does not fit``. All arguments in bytes."""
    if need_bytes <= gpu_bytes:
        return "fits"
    return "tight" if peak_bytes <= gpu_bytes else "does not fit"


@dataclass(frozen=True)
class FitVerdict:
    """One fit verdict with the numbers it rests on (bytes; ``*_gib`` in GiB = 2**30 bytes).

    ``word``: one of :data:`VERDICTS`; ``need_bytes``: what the GPU must hold (reserved + CUDA context +
    NCCL), the number the word is decided on; ``peak_bytes``: the tensor peak + CUDA context + NCCL, beside
    it (decides only between tight and does not fit); ``gpu_bytes``: the card's memory; ``gpu``: its name.
    ``line`` is the sentence every page, table and command prints (:func:`format_fit`)."""

    word: str
    need_bytes: int
    peak_bytes: int
    gpu_bytes: int
    gpu: str = ""

    @property
    def fits(self) -> bool:
        return self.word == "fits"

    @property
    def need_gib(self) -> float:
        return self.need_bytes / 2**30

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / 2**30

    @property
    def gpu_gib(self) -> float:
        return self.gpu_bytes / 2**30

    @property
    def line(self) -> str:
        return format_fit(self)

    def to_dict(self) -> dict:
        """The verdict as JSON-ready values: word, bytes, GiB, the GPU's name and the printed line."""
        return {"word": self.word, "gpu": self.gpu, "need_bytes": self.need_bytes, "peak_bytes": self.peak_bytes,
                "gpu_bytes": self.gpu_bytes, "need_gib": round(self.need_gib, 3),
                "peak_gib": round(self.peak_gib, 3), "gpu_gib": round(self.gpu_gib, 3), "line": self.line}  # fmt: skip


def fit_of_bytes(need_bytes: int, peak_bytes: int, gpu_bytes: int, gpu: str = "") -> FitVerdict:
    """:class:`FitVerdict` of bytes already estimated (the fit explorer's stored states); :func:`verdict_word`
    decides."""
    return FitVerdict(verdict_word(need_bytes, peak_bytes, gpu_bytes), need_bytes, peak_bytes, gpu_bytes, gpu)


def fit_verdict(estimate, gpu: GPU) -> FitVerdict:
    """The fit verdict of a ``smolfsdp.estimate.memory.MemoryEstimate`` on ``gpu``, with its numbers: need
    (``device_need_bytes``), tensor peak (``peak_bytes``) and the card's ``memory_bytes``."""
    return fit_of_bytes(estimate.device_need_bytes, estimate.peak_bytes, gpu.memory_bytes, gpu.name)


def format_fit(v: FitVerdict) -> str:
    """The one printed form of a verdict: ``"tight: needs 39.5 GiB reserved (tensor peak 31.1) of 37.3 GiB"``
    (GiB = 2**30 bytes, one decimal; "reserved" is reserved memory + CUDA context + NCCL, what the word is
    decided on). The fit explorer's script writes the same line (``book.figures.fit_explorer.VERDICT_JS``)."""
    return (
        f"{v.word}: needs {v.need_gib:.1f} GiB reserved (tensor peak {v.peak_gib:.1f}) of {v.gpu_gib:.1f} GiB"
    )


def verdict(estimate, gpu: GPU) -> str:
    """The word of :func:`fit_verdict`: ``fits``, ``tight`` or ``does not fit`` (:func:`verdict_word`)."""
    return fit_verdict(estimate, gpu).word


def fits(estimate, gpu: GPU, *, basis: str = "reserved") -> bool:
    """True when :func:`verdict` says ``fits`` (``basis="reserved"``, the default: reserved memory + CUDA
    context + NCCL within the card, ``smolfsdp.estimate.reserved.reserved_parts``). ``basis="tensors"``: True
    unless it says ``does not fit`` (the tensor peak + context + NCCL within the card: fits or tight). Raises
    ValueError for another basis."""
    if basis not in ("reserved", "tensors"):
        raise ValueError(f"basis={basis!r}: give 'reserved' or 'tensors'.")
    word = verdict(estimate, gpu)
    return word == "fits" if basis == "reserved" else word != "does not fit"


def fit_table(estimates: dict[str, object], gpus=None):
    """Rows of (setting, GPU, verdict, peak GiB, reserved GiB, need GiB, memory GiB, line) per named estimate
    and GPU: ``verdict`` the word of :func:`fit_verdict` (fits / tight / does not fit), ``need_gib`` what it is
    decided on (reserved + CUDA context + NCCL), ``peak_gib`` the tensor peak + context + NCCL beside it,
    ``line`` the printed sentence (:func:`format_fit`)."""
    import pandas as pd  # deferred: only the tables need pandas

    rows = []
    for label, est in estimates.items():
        for g in gpus or GPUS.values():
            v = fit_verdict(est, g)
            rows.append(
                {
                    "setting": label,
                    "gpu": g.name,
                    "verdict": v.word,
                    "peak_gib": v.peak_gib,
                    "reserved_gib": est.reserved_bytes / 2**30,
                    "need_gib": v.need_gib,
                    "gpu_memory_gib": v.gpu_gib,
                    "line": v.line,
                }
            )
    return pd.DataFrame(rows)
