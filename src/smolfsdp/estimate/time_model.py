"""The one time model: a run config's step time, tokens/s per GPU, the MFU used and where it comes from, and the
hours an epoch of its data takes. An estimate from FLOPs and collectives, never a measurement.

``smolfsdp memory --config ...`` prints it under the memory verdict; chapter 01 ("Running it on two GPUs",
``smolfsdp.book.two_gpu_run``), chapter 07 ("Scaling out", ``smolfsdp.book.scaling_views``) and the full profile's
time budget (``smolfsdp.book.full_budget``) call :func:`plan_time`, so every page states the same hours.

    python -c "from smolfsdp.estimate.time_model import plan_time; from smolfsdp.config import load_config as l; print('\\n'.join(plan_time(l('configs/runs/smollm3_3b_medical.yaml')).lines()))"

The step: ``scaling.estimate_step`` at the run's sequence (``max_length``), micro-batch, gradient accumulation,
strategy, FSDP version and precision, on ``n_gpus`` x ``gpu`` (one node unless the run has ``nnodes``), at the MFU
of ``calibration.run_mfu``: the GPU's HFU fitted to published runs, less the FLOPs the run's activation
checkpointing recomputes. Tokens: for the seed's data set, :func:`data_tokens` batches its seed-like rows as the run
does (a packed row is a ``max_length`` slot that TRL's BFD fills to a share; a padded row is the mean row padded to
its micro-batch's longest, and the step is estimated at that length); for other data every micro-batch row is a
whole ``max_length`` slot (the most a step can compute), of which a share ``token_share`` is real. The packed row's
attention is priced as causal rows of ``max_length``, not as SDPA's masked kernel over the flattened micro-batch
(measured 23 % slower per token than causal on an H200: ``smolfsdp.book.measured_throughput``). Epoch: the run's training rows (:func:`epoch_rows`), ``mean_row_tokens`` each
(default ``token_share x max_length``, i.e. one row per sequence slot as without packing):
``steps = ceil(rows x mean_row_tokens / (token_share x computed tokens per step))``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.calibration import run_mfu
from smolfsdp.estimate.cluster import DEFAULT_NETWORK
from smolfsdp.estimate.params import LoraSpec
from smolfsdp.estimate.scaling import estimate_step, recipe_dtypes
from smolfsdp.estimate.seed_lengths import DATASET, SEED_LENGTHS_PATH, packed_fill, seed_like_lengths
from smolfsdp.estimate.token_share import padded_share
from smolfsdp.paths import repo_root

#: What the default ``token_share`` (1.0) assumes, stated beside every number made with it.
DEFAULT_TOKEN_SHARE_TEXT = (
    "assumed: every row fills max_length, the most compute a step can take; the collator pads a micro-batch only "
    "to its longest row, and padding is not real"
)
#: The bundled sample's file (``dataset: bundled``), whose rows are counted here without loading the data code.
BUNDLED_ROWS_FILE = "data/medical_qa/medical_qa_sample.jsonl"


def epoch_rows(cfg) -> tuple[int | None, str]:
    """(training rows of one epoch, where the number comes from) for a ``TrainConfig``: the data set's rows (the
    bundled sample or a local ``.jsonl``: its lines), capped by ``max_rows``, less the held-out ``eval_size`` (a
    count, or a fraction rounded as ``data.prepare`` does). A hub data set is not read offline: ``max_rows`` is
    the row count then, at most that many (rows longer than ``max_length`` are dropped first); without ``max_rows``
    the rows are unknown: (None, why)."""
    path = repo_root() / (BUNDLED_ROWS_FILE if cfg.dataset == "bundled" else cfg.dataset)
    if cfg.dataset != "bundled" and Path(cfg.dataset).is_file():
        path = Path(cfg.dataset).resolve()
    if cfg.dataset == "bundled" or (str(cfg.dataset).endswith(".jsonl") and path.is_file()):
        with path.open() as f:
            total = sum(1 for line in f if line.strip())
        source = (
            f"{total:,} rows in {path.relative_to(repo_root()) if path.is_relative_to(repo_root()) else path}"
        )
        if cfg.max_rows is not None and cfg.max_rows < total:
            total, source = cfg.max_rows, f"max_rows {cfg.max_rows:,} of the {source}"
    elif cfg.max_rows is not None:
        total = cfg.max_rows
        source = (
            f"the recipe's max_rows {total:,} ({cfg.dataset} is not read offline: at most that many, rows longer than "
            f"max_length {cfg.max_length:,} are dropped first)"
        )
    else:
        return (
            None,
            f"{cfg.dataset} is not read offline and the run sets no max_rows: give max_rows for epoch hours",
        )
    held = int(cfg.eval_size) if cfg.eval_size >= 1 else round(cfg.eval_size * total)
    return total - held, f"{source}, less {held:,} held out for evaluation"


@dataclass(frozen=True)
class DataTokens:
    """Real and computed tokens of a run's data (:func:`data_tokens`): ``share`` real / computed, ``mean_row_tokens``
    real tokens per data set row, ``slot_tokens`` tokens computed per micro-batch row (a packed row: ``max_length``;
    a padded row: the mean row padded to its micro-batch's longest), ``text`` where they come from."""

    share: float
    mean_row_tokens: float
    slot_tokens: int
    text: str


def data_tokens(cfg) -> DataTokens | None:
    """The seed's data set (``seed_lengths.DATASET``, what the 3B recipes train on) as the run batches it, from the
    seed-like row lengths (``seed_lengths``: derived from published pieces, not measured): packed (``packing``),
    TRL's BFD fills ``packed_fill`` of each ``max_length`` row; padding-free alone computes only real tokens;
    otherwise each micro-batch is padded to its longest row (``token_share.padded_share`` at the run's micro-batch,
    shuffled by its seed). None for any other data set, or a ``max_length`` whose packed fill is not committed."""
    if cfg.dataset != DATASET:
        return None
    lengths = seed_like_lengths(cfg.max_length)
    mean = sum(lengths) / len(lengths)
    source = f"the seed-like rows of {SEED_LENGTHS_PATH}, derived from published pieces"
    if cfg.packing:
        fill = packed_fill(cfg.max_length)
        if fill is None:
            return None
        text = (
            f"packed: TRL's BFD fills {100 * fill:.1f} % of each {cfg.max_length:,}-token row with {source}"
        )
        return DataTokens(fill, mean, cfg.max_length, text)
    if cfg.padding_free:
        return DataTokens(1.0, mean, round(mean), f"padding-free: only real tokens computed ({source})")
    share = padded_share(lengths, cfg.per_device_train_batch_size, cfg.seed)
    text = f"padded to each micro-batch's longest row: {100 * share:.1f} % real at micro-batch "
    text += f"{cfg.per_device_train_batch_size} on {source}"
    return DataTokens(share, mean, round(mean / share), text)


def duration(seconds: float) -> str:
    """Seconds as a reader scans them: ms under 1 s, s under a minute, hours with minutes under 10 h, else hours."""
    if seconds < 1:
        return f"{1e3 * seconds:.1f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 36000:
        return f"{seconds / 3600:.2f} h ({seconds / 60:,.0f} min)"
    return f"{seconds / 3600:,.1f} h"


@dataclass(frozen=True)
class TimePlan:
    """One run's time, estimated (:func:`plan_time`). Seconds, tokens per second per GPU, fractions; ``epoch_*``
    None when the epoch's rows are unknown (``rows_source`` says why)."""

    gpu: str
    n_gpus: int
    step_s: float  # one optimizer step, communication overlapped (scaling.estimate_step)
    computed_tokens_per_step: (
        int  # per GPU: micro-batch x row slot (max_length, or a padded row) x micro-batches
    )
    token_share: float  # real tokens / computed tokens
    tokens_per_s_per_gpu: float  # real tokens
    mfu: float
    mfu_source: str
    token_text: str
    epoch_rows: int | None
    rows_source: str
    rows_per_step: int  # over all GPUs
    steps_per_epoch: int | None
    epoch_s: float | None
    run_steps: int | None  # the run's optimizer steps: benchmark_steps, max_steps, else the epochs'
    step: dict = field(repr=False, default_factory=dict)  # estimate_step's numbers

    @property
    def epoch_h(self) -> float | None:
        return None if self.epoch_s is None else self.epoch_s / 3600

    def lines(self) -> list[str]:
        """What ``smolfsdp memory`` prints: step time, tokens/s per GPU, the MFU and its source, epoch hours."""
        out = [
            f"step time (estimated): {duration(self.step_s)} per optimizer step on {self.n_gpus} x {self.gpu} "
            f"({self.computed_tokens_per_step:,} tokens per GPU in its row slots)",
            f"real tokens/s per GPU (estimated): {self.tokens_per_s_per_gpu:,.0f} "
            f"({100 * self.token_share:.0f} % of the tokens in the row slots; {self.token_text})",
            f"MFU: {self.mfu_source}",
        ]
        if self.epoch_s is None:
            out.append(f"epoch: not estimated ({self.rows_source})")
        else:
            out.append(
                f"epoch (estimated): {duration(self.epoch_s)}, {self.steps_per_epoch:,} optimizer steps of "
                f"{self.rows_per_step} rows ({self.epoch_rows:,} training rows: {self.rows_source})"
            )
        return out

    def to_dict(self) -> dict:
        """JSON-ready: every field, ``epoch_h`` too, ``step`` (estimate_step's numbers) as floats."""
        d = asdict(self)
        d["step"] = {k: (float(v) if hasattr(v, "dtype") else v) for k, v in self.step.items()}
        return {**d, "epoch_h": self.epoch_h}


def run_optimizer_steps(cfg, steps_per_epoch: int | None) -> int | None:
    """A run's optimizer steps: ``benchmark_steps``, else ``max_steps`` (> 0), else the epochs' steps."""
    if cfg.benchmark_steps:
        return cfg.benchmark_steps
    if cfg.max_steps > 0:
        return cfg.max_steps
    return None if steps_per_epoch is None else math.ceil(cfg.num_train_epochs * steps_per_epoch)


def plan_time(
    cfg,
    gpu: str = "H100 SXM",
    n_gpus: int | None = None,
    *,
    token_share: float | None = None,
    mean_row_tokens: float | None = None,
    rows: int | None = None,
    gpus_per_node: int | None = None,
    network: str | None = None,
) -> TimePlan:
    """The :class:`TimePlan` of ``cfg`` (a ``TrainConfig``) on ``n_gpus`` (default ``cfg.nproc``) x ``gpu`` (a
    name of ``hardware.GPUS``). ``token_share``: real / computed tokens in (0, 1] (default 1.0, stated:
    :data:`DEFAULT_TOKEN_SHARE_TEXT`); ``mean_row_tokens``: real tokens per data set row (packing: rows share a
    slot); ``rows``: the epoch's training rows (default :func:`epoch_rows`). ``gpus_per_node`` default: the run's
    ``nproc / nnodes`` on several nodes, else 8 (chapter 07's assumption); ``network``: ``cluster.DEFAULT_NETWORK``. Raises
    ConfigError for a share outside (0, 1], a GPU without a bf16 peak, and ``estimate_step``'s errors."""
    data = data_tokens(cfg) if token_share is None and mean_row_tokens is None else None
    share = (data.share if data else 1.0) if token_share is None else float(token_share)
    if not 0 < share <= 1:
        raise ConfigError(f"token_share={token_share}: give real / computed tokens as a fraction in (0, 1].")
    n = cfg.nproc if n_gpus is None else n_gpus
    per_node = gpus_per_node or (cfg.nproc // cfg.nnodes if cfg.nnodes > 1 else 8)
    lora = LoraSpec(cfg.lora_r, cfg.lora_alpha, tuple(cfg.lora_target_modules)) if cfg.lora else None
    ac = cfg.ac_mode if cfg.activation_checkpointing else None
    mfu = run_mfu(gpu, cfg.model, seq_len=cfg.max_length, ac_mode=ac, ac_every=cfg.ac_every, lora=lora)
    precision = recipe_dtypes("hf-fsdp-bf16" if cfg.mixed_precision == "bf16" else "fp32")
    step = estimate_step(
        cfg.model, strategy=cfg.sharding_strategy, n_gpus=n, gpu=gpu, gpus_per_node=per_node,
        network=network or DEFAULT_NETWORK, seq_len=data.slot_tokens if data else cfg.max_length, micro_batch=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, mfu=mfu["mfu"], fsdp_version=cfg.fsdp_version,
        lora=lora, **precision,
    )  # fmt: skip
    computed = int(step["tokens_per_gpu"])
    rows_per_step = n * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    n_rows, source = (rows, "given") if rows is not None else epoch_rows(cfg)
    if data is not None:
        mean_row_tokens = data.mean_row_tokens if cfg.packing else None  # unpacked: a row per slot
    slot = data.slot_tokens if data else cfg.max_length
    row_tokens = share * slot if mean_row_tokens is None else float(mean_row_tokens)
    steps = None if n_rows is None else math.ceil(n_rows * row_tokens / (share * computed * n) - 1e-9)
    if data is not None:
        text = data.text
    elif token_share is None:
        text = DEFAULT_TOKEN_SHARE_TEXT
    else:
        text = "given" + (f", {row_tokens:,.0f} real tokens per row" if mean_row_tokens is not None else "")
    if cfg.packing and mean_row_tokens is None and data is None:
        text += (
            "; packing is on, but without the real tokens per row each row counts as a whole max_length slot"
        )
    return TimePlan(
        gpu=gpu, n_gpus=n, step_s=float(step["step_s"]), computed_tokens_per_step=computed, token_share=share,
        tokens_per_s_per_gpu=share * float(step["tokens_per_s_per_gpu"]), mfu=mfu["mfu"], mfu_source=mfu["text"],
        token_text=text, epoch_rows=n_rows, rows_source=source, rows_per_step=rows_per_step,
        steps_per_epoch=steps, epoch_s=None if steps is None else steps * float(step["step_s"]),
        run_steps=run_optimizer_steps(cfg, steps), step=step,
    )  # fmt: skip
