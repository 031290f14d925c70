"""Run configuration: one flat dataclass whose defaults are the CPU smoke run.

A run is ``configs/runs/<name>.yaml`` (keys are the fields below) overridden by CLI flags (``--key value``).
``__post_init__`` checks what the fields alone decide: declared types (a quoted ``"false"`` is refused, never
read as true; ``max_steps: 2.5`` is refused), ranges and combinations. The checks that need the model, the
mesh or the launcher run where a run starts: :func:`smolfsdp.launch.validate.validate`.

    smolfsdp train --config configs/runs/smoke.yaml --max_steps 20
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from smolfsdp.ac_options import check_ac_options
from smolfsdp.errors import ConfigError, did_you_mean
from smolfsdp.lora_options import QUANTISED_LOADING, QUANTISED_REFUSAL, check_lora
from smolfsdp.run_options import check_run_options
from smolfsdp.secrets import REDACTED, redact, redacted_keys
from smolfsdp.yaml_files import coerce_value, read_recipe

ENGINES = ("native", "trl")
FSDP_VERSIONS = (1, 2)
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
MIXED_PRECISION = ("no", "bf16")
#: transformers' SchedulerType names that get_scheduler builds from (warmup, total steps) alone: both engines
#: pass nothing else (reduce_lr_on_plateau and greedy need an eval metric per step; cosine_with_min_lr,
#: cosine_warmup_with_min_lr and warmup_stable_decay need lr_scheduler_kwargs).
SCHEDULERS = tuple(
    "linear cosine cosine_with_restarts polynomial constant constant_with_warmup inverse_sqrt".split()
)

#: Sections of ``smolfsdp train --help``, in order; each field names its own in ``metadata["group"]``.
MODEL = "model and data"
SHARDING = "engine and sharding"
LORA = "LoRA (peft)"
OPTIM = "optimisation"
RUN = "run folder and logging"
CHECKPOINTS = "checkpoints"
BENCH = "benchmark and profile"
LAUNCH = "launch and faults"
GROUPS = (MODEL, SHARDING, LORA, OPTIM, RUN, CHECKPOINTS, BENCH, LAUNCH)


def _field(default: Any, group: str, help: str, factory: Any = dataclasses.MISSING) -> Any:
    """A field with its ``--help`` line and section (one of ``GROUPS``); ``factory``: a mutable default."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": help, "group": group})
    return field(default=default, metadata={"help": help, "group": group})


@dataclass
class TrainConfig:
    """What to train and how to shard it. Defaults = the CPU smoke run (``make demo``)."""

    # _field(default, group, help): each field's --help line and section (cli_args builds the options)
    name: str = _field("smoke", RUN, "run name: the folder runs/<name>/ (one plain folder name)")
    output_dir: str = _field("runs", RUN, "parent folder of the run folders")
    seed: int = _field(0, OPTIM, "seed of model init, data shuffle and dropout")
    model: str = _field("tiny", MODEL, "'tiny' (random SmolLM3), a hub id or a local folder")
    tokenizer: str | None = _field(None, MODEL, "id or folder; unset: bundled for 'tiny', else the model's")
    trust_remote_code: bool = _field(False, MODEL, "run the hub repo's Python on each rank (only if audited)")
    wrap_class: str | None = _field(None, SHARDING, "class FSDP wraps as a unit; unset: _no_split_modules")
    dataset: str = _field("bundled", MODEL, "'bundled', a .jsonl/.json/.csv/.parquet file, or a hub id")
    dataset_config: str | None = _field(None, MODEL, "hub data set configuration name")
    dataset_split: str = _field("train", MODEL, "split to read")
    columns: str = _field("auto", MODEL, "'auto' or a mapping name in data.prepare.COLUMN_MAPPINGS")
    include_reasoning: bool = _field(False, MODEL, "keep the data set's reasoning text in the answer")
    system_prompt: str | None = _field(None, MODEL, "system message put before every question")
    max_length: int = _field(256, MODEL, "tokens per row, at most the model's max_position_embeddings")
    # "drop" never cuts the answer (with include_reasoning the reasoning is cut first); "truncate" cuts at
    # the end, so the answer loses its end-of-turn token: for drills only
    too_long: str = _field("drop", MODEL, "rows over max_length: 'drop' (counted) or 'truncate' (drills)")
    # throughput options, TRL's names (smolfsdp.run_options)
    packing: bool = _field(False, MODEL, "pack rows into max_length-token rows (TRL's BFD), rows kept apart")
    padding_free: bool = _field(False, MODEL, "one row per micro-batch, no padding (position ids per row)")
    attn_implementation: str | None = _field(None, SHARDING, "'sdpa', 'eager', 'flash_attention_2', ...")
    torch_compile: bool = _field(False, SHARDING, "compile the model with torch.compile")
    use_liger_kernel: bool = _field(False, SHARDING, "Liger's fused kernels (RMSNorm, RoPE, SwiGLU, loss)")
    eval_size: float = _field(0.1, MODEL, "held out for eval: a fraction (< 1) or a number of rows (>= 1)")
    max_rows: int | None = _field(None, MODEL, "use only the first N rows; unset: all")
    engine: str = _field("native", SHARDING, "'native' (plain PyTorch loop) or 'trl' (TRL SFTTrainer)")
    fsdp_version: int = _field(1, SHARDING, "1 (FullyShardedDataParallel) or 2 (fully_shard, DTensor)")
    nproc: int = _field(2, LAUNCH, "total processes (world size), over all nodes")
    backward_prefetch: str = _field("BACKWARD_PRE", SHARDING, "FSDP1: BACKWARD_PRE/_POST or NO_PREFETCH")
    state_dict_type: str = _field("SHARDED_STATE_DICT", CHECKPOINTS, "DCP shards per rank or FULL_STATE_DICT")
    cpu_offload: bool = _field(False, SHARDING, "keep parameters, gradients, optimizer state in CPU memory")
    mixed_precision: str = _field("no", SHARDING, "'no' (fp32) or 'bf16'")
    activation_checkpointing: bool = _field(False, SHARDING, "recompute each layer's activations in backward")
    ac_mode: str = _field("full", SHARDING, "'full', 'layer' (each ac_every-th) or 'op' (selective)")
    ac_every: int | None = _field(None, SHARDING, "ac_mode layer: checkpoint every k-th decoder layer")
    reshard_after_forward: bool = _field(True, SHARDING, "FSDP2: free gathered layers after forward (ZeRO-3)")
    use_orig_params: bool = _field(True, SHARDING, "FSDP1: original parameters as views (LoRA needs it)")
    # false = accelerate as shipped, which keeps the FSDP plugin only on accelerators and runs DDP on CPU
    # (smolfsdp.train.accelerate_cpu_fsdp lifts that gate)
    accelerate_fsdp_on_cpu: bool = _field(True, SHARDING, "TRL on CPU: FSDP on gloo (false: DDP, as shipped)")
    # FSDP1 names for both versions: SHARD_GRAD_OP is FSDP2's reshard_after_forward=False, HYBRID_SHARD a
    # 2-D mesh, NO_SHARD a mesh of world x 1 (smolfsdp.sharding.fsdp2.resolve_mesh_shape)
    sharding_strategy: str = _field("FULL_SHARD", SHARDING, "SHARD_GRAD_OP, HYBRID_SHARD (HSDP) or NO_SHARD")
    replicate_size: int | None = _field(None, SHARDING, "HSDP mesh rows (e.g. nodes); unset: from strategy")
    shard_size: int | None = _field(None, SHARDING, "HSDP mesh columns (ranks per shard group)")
    lora: bool = _field(False, LORA, "train LoRA adapters (peft) instead of all weights")
    lora_r: int = _field(8, LORA, "LoRA rank")
    lora_alpha: int = _field(16, LORA, "LoRA scaling numerator (scale = alpha / r)")
    lora_dropout: float = _field(0.05, LORA, "dropout on the LoRA input, in [0, 1)")
    lora_target_modules: list[str] = _field(
        None,
        LORA,
        "linear layers to adapt (space- or comma-separated)",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    lora_merge: bool = _field(False, LORA, "also save the base model with the adapter merged in")
    lora_layout: str = _field(
        "in-unit", LORA, "FSDP1: 'in-unit' or 'adapter-units' (each adapter its own unit)"
    )
    num_train_epochs: float = _field(6.0, OPTIM, "epochs over the training rows")
    max_steps: int = _field(-1, OPTIM, "optimizer steps; > 0 overrides num_train_epochs")
    per_device_train_batch_size: int = _field(4, OPTIM, "rows per rank per micro-batch")
    per_device_eval_batch_size: int = _field(8, OPTIM, "rows per rank per eval batch")
    gradient_accumulation_steps: int = _field(1, OPTIM, "micro-batches per optimizer step")
    learning_rate: float = _field(0.003, OPTIM, "peak AdamW learning rate")
    weight_decay: float = _field(0.0, OPTIM, "AdamW's decoupled weight decay, >= 0")
    warmup_ratio: float = _field(0.05, OPTIM, "fraction of the steps spent warming up, in [0, 1]")
    lr_scheduler_type: str = _field("cosine", OPTIM, "one of " + ", ".join(SCHEDULERS))
    # HF's Trainer reads <= 0 as "no clipping", torch's clip_grad_norm_ would scale by it: refused for both
    max_grad_norm: float = _field(1.0, OPTIM, "clip the global grad norm to this (> 0; 1e6: no clipping)")
    logging_steps: int = _field(1, RUN, "log loss, grad norm and lr every N steps")
    eval_steps: int = _field(
        10, RUN, "evaluate every N steps and at the end (0: at the end only); at step 0 too if eval_on_start"
    )
    eval_on_start: bool = _field(True, RUN, "also evaluate at step 0 (a resumed run: the step it starts at)")
    save_steps: int = _field(0, CHECKPOINTS, "checkpoint every N steps (0: none; the final model is saved)")
    save_final_model: bool = _field(True, CHECKPOINTS, "write runs/<name>/final_model/ at the end")
    save_total_limit: int = _field(2, CHECKPOINTS, "complete checkpoints kept (older ones are removed)")
    resume_from: str | None = _field(None, CHECKPOINTS, "'latest' or a checkpoint folder to continue from")
    overwrite: bool = _field(False, CHECKPOINTS, "allow replacing a run folder that holds checkpoints")
    stop_at_step: int | None = _field(None, CHECKPOINTS, "end the run after this step, as if killed (drills)")
    # benchmark mode and profiler: smolfsdp.measure.benchmark, chapter "Reading the profiler"
    benchmark_steps: int = _field(0, BENCH, "> 0: benchmark mode, N timed steps into bench.json, no saves")
    benchmark_warmup_steps: int = _field(1, BENCH, "steps before the timed ones (left out of the summary)")
    profile: bool = _field(False, BENCH, "torch.profiler: one Chrome trace per rank in runs/<name>/traces/")
    profile_wait: int = _field(1, BENCH, "profiler schedule: steps skipped first")
    profile_warmup: int = _field(1, BENCH, "profiler schedule: steps traced, then discarded")
    profile_active: int = _field(3, BENCH, "profiler schedule: steps recorded")
    record_shapes: bool = _field(False, BENCH, "profiler: record input shapes (larger traces)")
    # launch and faults: smolfsdp.launch.torchrun, chapter "Beyond two GPUs"
    nnodes: int = _field(1, LAUNCH, "nodes; each starts nproc / nnodes processes")
    node_rank: int = _field(0, LAUNCH, "this node's index; node 0 serves the rendezvous")
    rdzv_endpoint: str | None = _field(None, LAUNCH, "host:port of node 0 (c10d rendezvous) when nnodes > 1")
    rdzv_timeout_s: float = _field(300.0, LAUNCH, "seconds a node waits for the rendezvous before failing")
    max_restarts: int = _field(0, LAUNCH, "torchrun restarts after a rank fails (they resume from latest)")
    collective_timeout_s: float = _field(600.0, LAUNCH, "seconds before a hung collective fails, naming it")
    extra: dict[str, Any] = _field(None, RUN, "free-form notes copied into summary.json", factory=dict)

    def __post_init__(self) -> None:
        self._check_types()
        self._check_choices()
        if self.nproc < 1:
            raise ConfigError(f"nproc={self.nproc}: need at least one process.")
        if self.too_long not in ("drop", "truncate"):
            raise ConfigError(
                f"too_long={self.too_long!r}: use 'drop' (rows that do not fit are dropped, counted) or "
                "'truncate' (cut at max_length; drills only)."
            )
        if self.max_length < 8:
            raise ConfigError(
                f"max_length={self.max_length} is too small; use at least 8 (256 for the smoke run)."
            )
        batch = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
        for name in (*batch, "logging_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1.")
        check_lora(self)  # smolfsdp.lora_options: rank, targets, dropout, engine, lora_layout
        check_ac_options(self.activation_checkpointing, self.ac_mode, self.ac_every, self.engine)
        check_run_options(self)  # smolfsdp.run_options: packing, padding-free, attention, compile, Liger
        if not self.name or self.name != self.name.strip() or "/" in self.name or self.name.startswith("."):
            raise ConfigError(
                f"name={self.name!r}: a run name is one plain folder name (no '/', not empty, "
                "no leading '.'), e.g. smoke or lora_r16."
            )
        if self.save_total_limit < 1:
            raise ConfigError(
                f"save_total_limit={self.save_total_limit} must be >= 1 (the checkpoint to resume from)."
            )
        if self.stop_at_step is not None and self.stop_at_step < 1:
            raise ConfigError(f"stop_at_step={self.stop_at_step} must be >= 1.")
        if self.eval_size < 0:
            raise ConfigError(f"eval_size={self.eval_size} must be >= 0 (fraction < 1 or a row count).")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate={self.learning_rate} must be > 0.")
        self._check_optimisation()
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ConfigError(
                "Set max_steps > 0 or num_train_epochs > 0; as given the run would train nothing."
            )
        self._check_benchmark()
        self.sharding_strategy = str(self.sharding_strategy).upper()

    def _check_choices(self) -> None:
        """Fields that name one of a fixed set (engine, FSDP version, prefetch, state dict, precision)."""
        if self.engine not in ENGINES:
            raise ConfigError(
                f"engine={self.engine!r} is not known; use one of {ENGINES}.{did_you_mean(self.engine, ENGINES)}"
            )
        if int(self.fsdp_version) not in FSDP_VERSIONS:
            raise ConfigError(
                f"fsdp_version={self.fsdp_version!r}: use 1 (FullyShardedDataParallel) or 2 (fully_shard)."
            )
        self.fsdp_version = int(self.fsdp_version)
        self.backward_prefetch = str(self.backward_prefetch).upper()
        if self.backward_prefetch not in BACKWARD_PREFETCH:
            raise ConfigError(
                f"backward_prefetch={self.backward_prefetch!r}: use one of {BACKWARD_PREFETCH}."
                f"{did_you_mean(self.backward_prefetch, BACKWARD_PREFETCH)}"
            )
        self.state_dict_type = str(self.state_dict_type).upper()
        if self.state_dict_type not in STATE_DICT_TYPES:
            raise ConfigError(f"state_dict_type={self.state_dict_type!r}: use one of {STATE_DICT_TYPES}.")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(f"mixed_precision={self.mixed_precision!r}: use one of {MIXED_PRECISION}.")

    # ------------------------------------------------------------------ types and ranges
    def _check_types(self) -> None:
        """Each field holds its declared type: ``bool`` fields a real boolean (a YAML string such as
        ``"false"`` or ``"no"`` is refused, never read as true), ``int`` fields a whole number (``2.0`` becomes
        ``2``, ``2.5`` is refused), ``float`` fields a number (int or float), ``str`` fields a string."""
        for f in fields(self):
            declared = str(f.type)
            base, value = declared.replace(" | None", ""), getattr(self, f.name)
            if value is None and "None" in declared:
                continue
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if base == "bool" and not isinstance(value, bool):
                raise ConfigError(
                    f"{f.name}={value!r} is a {type(value).__name__}, not a boolean: write {f.name}: true or false "
                    f"without quotes in YAML (--{f.name} true/false on the command line); quoted text such as "
                    '"false" or "no" is never read as a boolean.'
                )
            if base == "int":
                if not number or (isinstance(value, float) and not value.is_integer()):
                    raise ConfigError(
                        f"{f.name}={value!r} must be a whole number (an int), e.g. {f.name}: 20."
                    )
                setattr(self, f.name, int(value))
            elif base == "float" and not number:  # an int stays an int: 0 prints as 0 in messages
                raise ConfigError(f"{f.name}={value!r} must be a number, e.g. {f.name}: 0.1.")
            elif base == "str" and not isinstance(value, str):
                raise ConfigError(f"{f.name}={value!r} must be text (a string).")

    def _check_optimisation(self) -> None:
        if self.lr_scheduler_type not in SCHEDULERS:
            raise ConfigError(
                f"lr_scheduler_type={self.lr_scheduler_type!r} is not a scheduler smolfsdp can build; use one of "
                f"{SCHEDULERS}.{did_you_mean(self.lr_scheduler_type, SCHEDULERS)}"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay={self.weight_decay} must be >= 0 (0.0 or 0.01 are usual).")
        if self.max_grad_norm <= 0:
            raise ConfigError(
                f"max_grad_norm={self.max_grad_norm}: must be > 0. HF's Trainer reads <= 0 as no clipping but the "
                "native engine's clip_grad_norm_ would scale gradients by it (0 freezes the model, -1 climbs the "
                "loss); give 1.0 (usual), or 1e6 to clip in effect never."
            )
        if not 0 <= self.warmup_ratio <= 1:
            raise ConfigError(
                f"warmup_ratio={self.warmup_ratio} must be in [0, 1] (a fraction of the steps)."
            )
        if self.num_train_epochs < 0:
            raise ConfigError(f"num_train_epochs={self.num_train_epochs} must be >= 0.")
        for name in ("eval_steps", "save_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0 (0: never).")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"max_rows={self.max_rows} must be >= 1 (or unset for all rows).")

    def _check_benchmark(self) -> None:
        if self.benchmark_steps < 0:
            raise ConfigError(
                f"benchmark_steps={self.benchmark_steps}: give a positive number of timed steps (0 = no benchmark)."
            )
        if self.benchmark_warmup_steps < 0:
            raise ConfigError(f"benchmark_warmup_steps={self.benchmark_warmup_steps} must be >= 0.")
        for name in ("profile_wait", "profile_warmup"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0.")
        if self.profile_active < 1:
            raise ConfigError(f"profile_active={self.profile_active}: record at least one step.")
        if self.benchmark_steps:
            if self.save_steps > 0:
                raise ConfigError("benchmark mode writes no checkpoints; set save_steps: 0.")
            self.save_final_model = False  # benchmark mode saves nothing but bench.json and traces
            total = self.benchmark_warmup_steps + self.benchmark_steps
            window = self.profile_wait + self.profile_warmup + self.profile_active
            if self.profile and total < window:
                raise ConfigError(
                    f"profile needs {window} steps (wait {self.profile_wait} + warmup {self.profile_warmup} + "
                    f"active {self.profile_active}) but benchmark mode runs {total}; raise benchmark_steps."
                )
            self.max_steps = total

    # ------------------------------------------------------------------ I/O
    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path, redact_secrets: bool = True) -> None:
        """Write this config as flat YAML to ``path``.

        With ``redact_secrets`` (the default, for every file a person or a later run reads: the run folder's and
        each checkpoint's ``config.yaml``) values under secret-looking keys, values of secret environment
        variables and token-shaped substrings become ``<redacted>`` (:func:`smolfsdp.secrets.redact`). That also
        hits a token-shaped part of a file path (a dataset named ``hf_medicalquestionanswers2024.jsonl`` is
        written as ``<redacted>.jsonl``): a deliberate trade, since a written config must never leak a real
        token, at the price of a path that no longer loads as written. ``redact_secrets=False`` writes the config
        exactly as resolved; only the launcher uses it, for the short-lived private file its ranks TRAIN with.
        """
        data = self.to_dict()
        if redact_secrets:  # tokens and secrets never reach a written config
            data = redact(data)
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def field_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def check_keys(keys, where: str) -> None:
    """Raise ConfigError for keys that are not TrainConfig fields, suggesting the nearest one (a quantised-loading
    key of TRL's, :data:`QUANTISED_LOADING`, gets the reason it is not supported)."""
    valid = field_names()
    for key in keys:
        if key in QUANTISED_LOADING:
            raise ConfigError(f"{key!r} in {where}: {QUANTISED_REFUSAL}")
        if key not in valid:
            raise ConfigError(
                f"Unknown key {key!r} in {where}.{did_you_mean(key, valid)} Valid keys: {', '.join(valid)}."
            )


def load_config(
    path: str | Path | None = None, *, redacted_ok: bool = False, **overrides: Any
) -> TrainConfig:
    """Load ``configs/runs/*.yaml`` (optional) and apply ``overrides``; validate everything. ``redacted_ok``: read
    a recorded config for what was not redacted (``smolfsdp convert`` wants its model and LoRA settings only).

    Raises:
        ConfigError: a missing file, one over :data:`smolfsdp.yaml_files.MAX_RECIPE_BYTES`, YAML aliases or tags
            (:func:`smolfsdp.yaml_files.read_recipe`), an unknown key (with the nearest valid one), an invalid value,
            or a value holding ``<redacted>`` that no override replaces (a run folder's ``config.yaml``).
    """
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            what = "is not a regular file" if p.exists() else "does not exist"
            raise ConfigError(f"Run config {str(p)!r} {what}. Named runs live in configs/runs/*.yaml.")
        values = read_recipe(p) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{p} must hold a mapping of TrainConfig fields, got {type(values).__name__}.")
        check_keys(values, str(p))
        kept = {k: v for k, v in values.items() if overrides.get(k) is None}
        if not redacted_ok and (keys := redacted_keys(kept)):
            raise ConfigError(
                f"{p}: {keys[0]} holds {REDACTED!r}: a token-shaped part of its value was redacted when the run "
                f"recorded it, so training on it would use the placeholder. Pass the real value with "
                f"--{keys[0].split('.')[0]} (it overrides the file), or write it into a copy of {p.name}."
            )
    check_keys(overrides, "the overrides")
    values.update({k: v for k, v in overrides.items() if v is not None})
    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    return TrainConfig(**{k: coerce_value(k, types[k], v) for k, v in values.items()})
