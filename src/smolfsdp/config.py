"""Run configuration: one flat dataclass whose defaults are the CPU smoke run.

Every chapter and every CLI command resolves a run the same way:
``configs/runs/<name>.yaml`` (keys are the fields below) overridden by CLI flags
(``--key value``). ``__post_init__`` checks what the fields alone decide: each field holds its declared
type (a YAML boolean is ``true``/``false`` unquoted; a quoted ``"false"`` is refused, never read as true;
``max_steps: 2.5`` is refused), a value in its range, and the combinations among them.

What needs the model presets, the mesh or the launcher (model name, ``wrap_class``, strategy and mesh,
node and rendezvous fields) is checked where a run starts, by :func:`smolfsdp.launch.validate.validate`.

    smolfsdp train --config configs/runs/smoke.yaml --max_steps 20
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from smolfsdp.errors import ConfigError, did_you_mean
from smolfsdp.secrets import redact

ENGINES = ("native", "trl")
FSDP_VERSIONS = (1, 2)
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
MIXED_PRECISION = ("no", "bf16")
#: transformers' SchedulerType names that get_scheduler builds from (warmup, total steps) alone: both engines
#: pass nothing else (reduce_lr_on_plateau and greedy need an eval metric per step; cosine_with_min_lr,
#: cosine_warmup_with_min_lr and warmup_stable_decay need lr_scheduler_kwargs).
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)


@dataclass
class TrainConfig:
    """What to train and how to shard it. Defaults = the CPU smoke run (``make demo``)."""

    # --- identity and output
    name: str = "smoke"
    output_dir: str = "runs"
    seed: int = 0

    # --- model and tokenizer
    model: str = "tiny"  # "tiny" preset, a hub id (e.g. HuggingFaceTB/SmolLM3-3B) or a local path
    tokenizer: str | None = None  # None: the bundled tokenizer for "tiny", the model's own otherwise
    trust_remote_code: bool = False  # True runs the hub repo's own Python on every rank: off unless audited
    wrap_class: str | None = None  # None: discovered from the model's _no_split_modules

    # --- data
    dataset: str = "bundled"  # "bundled", a local .jsonl/.json/.csv/.parquet file, or a hub id
    dataset_config: str | None = None
    dataset_split: str = "train"
    columns: str = "auto"  # "auto" or a mapping name in smolfsdp.data.prepare.COLUMN_MAPPINGS
    include_reasoning: bool = False
    system_prompt: str | None = None
    # tokens per row; at most the model's max_position_embeddings (checked before launch)
    max_length: int = 256
    # rows longer than max_length: "drop" (counted; with include_reasoning the reasoning is cut first, never
    # the answer) or "truncate" (cut at the end: the answer loses its end-of-turn token; drills only)
    too_long: str = "drop"
    eval_size: float = 0.1  # fraction (<1) or number of rows (>=1) held out for eval
    max_rows: int | None = None

    # --- distribution
    engine: str = "native"  # "native" (plain PyTorch loop) or "trl" (TRL SFTTrainer)
    fsdp_version: int = 1
    nproc: int = 2
    backward_prefetch: str = "BACKWARD_PRE"
    state_dict_type: str = "SHARDED_STATE_DICT"
    cpu_offload: bool = False
    mixed_precision: str = "no"  # "no" (fp32) or "bf16"
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True  # FSDP2: free gathered layers after forward (ZeRO-3)
    use_orig_params: bool = True  # FSDP1: keep original parameters as views (needed for LoRA)
    # TRL engine on CPU: lift accelerate's accelerator-only gate so the Trainer applies FSDP on gloo
    # (smolfsdp.train.accelerate_cpu_fsdp); false = accelerate as shipped, which runs DDP on CPU
    accelerate_fsdp_on_cpu: bool = True
    # HSDP and the other strategies (smolfsdp.sharding.fsdp2.resolve_mesh_shape); FSDP1 names for both versions:
    # FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2; FSDP2: reshard_after_forward=False), HYBRID_SHARD
    # (shard within a group, replicate across groups; FSDP2: 2-D mesh), NO_SHARD (FSDP2: mesh world x 1)
    sharding_strategy: str = "FULL_SHARD"
    replicate_size: int | None = None  # HSDP mesh rows (e.g. nodes); None = derived from the strategy
    shard_size: int | None = None  # HSDP mesh columns (ranks per shard group); None = derived

    # --- LoRA (peft), trained with the native engine
    lora: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    lora_merge: bool = False  # also save the base model with the adapter merged in

    # --- optimisation
    num_train_epochs: float = 6.0
    max_steps: int = -1  # > 0 overrides num_train_epochs
    per_device_train_batch_size: int = 4
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3e-3
    weight_decay: float = 0.0  # >= 0 (AdamW's decoupled decay; negative would grow the weights)
    warmup_ratio: float = 0.05  # in [0, 1]
    lr_scheduler_type: str = "cosine"  # one of SCHEDULERS (SchedulerType names needing no extra kwargs)
    # > 0: clip the global gradient norm to this. HF's Trainer reads <= 0 as "no clipping" while
    # torch's clip_grad_norm_ (the native engine) would scale gradients by it (0 freezes, -1 climbs), so
    # <= 0 is refused for both engines; for no clipping in effect give a large value (1e6).
    max_grad_norm: float = 1.0

    # --- logging, eval, checkpoints
    logging_steps: int = 1
    eval_steps: int = 10
    save_steps: int = 0  # 0: no periodic checkpoints; the final model is always saved
    save_final_model: bool = True
    save_total_limit: int = 2  # complete checkpoints kept (older ones are removed after a new one completes)
    resume_from: str | None = None  # "latest" or a checkpoint directory (both engines)
    overwrite: bool = False  # allow replacing a run folder that holds checkpoints
    stop_at_step: int | None = None  # end the run after this step, as if killed (resume drills)

    # --- benchmark mode and profiler (smolfsdp.measure.benchmark; chapter "Reading the profiler")
    benchmark_steps: int = 0  # > 0: benchmark mode: warm-up + this many timed steps, bench.json, no saves
    benchmark_warmup_steps: int = 1  # steps run before the timed ones (not in the bench.json summary)
    profile: bool = False  # torch.profiler: one gzip'd Chrome trace per rank in runs/<name>/traces/
    profile_wait: int = 1
    profile_warmup: int = 1
    profile_active: int = 3
    record_shapes: bool = False

    # --- launch and faults (smolfsdp.launch.torchrun; chapter "Beyond two GPUs")
    nnodes: int = 1  # nodes; nproc is the total process count, each node starts nproc // nnodes
    node_rank: int = 0  # this node's index; node 0 serves the rendezvous at rdzv_endpoint
    rdzv_endpoint: str | None = None  # host:port of node 0 (c10d rendezvous), required when nnodes > 1
    rdzv_timeout_s: float = 300.0  # a node waits this long for the rendezvous, then fails naming it
    max_restarts: int = 0  # torchrun restarts of the worker group after a rank fails (resume from latest)
    collective_timeout_s: float = 600.0  # process-group timeout: a hung collective fails, naming rank and op

    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes copied into summary.json

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
        self._check_lora()
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

    def _check_lora(self) -> None:
        if not self.lora:
            return
        if self.lora_r <= 0:
            raise ConfigError(f"lora_r={self.lora_r}: the LoRA rank must be a positive integer (8 is usual).")
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [m.strip() for m in self.lora_target_modules.split(",") if m.strip()]
        if not self.lora_target_modules:
            raise ConfigError(
                "lora_target_modules is empty; name the linear layers to adapt, e.g. q_proj,v_proj."
            )
        if self.engine != "native":
            raise ConfigError(
                "lora=true runs on the native engine (plain PyTorch loop + FSDP); set engine: native."
            )
        if self.fsdp_version == 1 and not self.use_orig_params:
            raise ConfigError(
                "LoRA with FSDP1 needs use_orig_params=true: with use_orig_params=false FSDP1 flattens each unit "
                "into one FlatParameter with a single requires_grad, so frozen base weights and trainable "
                "adapters cannot share a unit. Set use_orig_params: true, or use fsdp_version: 2."
            )

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
        if self.lora and not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout={self.lora_dropout} must be in [0, 1).")

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

        With ``redact_secrets`` (the default, for every file a person or a later run reads: the run
        folder's and each checkpoint's ``config.yaml``) values under secret-looking keys, values of secret
        environment variables and token-shaped substrings become ``<redacted>``
        (:func:`smolfsdp.secrets.redact`). That also hits a token-shaped part of a file path (a dataset
        named ``hf_medicalquestionanswers2024.jsonl`` is written as ``<redacted>.jsonl``): a deliberate
        trade, since a written config must never leak a real token, at the price of a path that no longer
        loads as written. ``redact_secrets=False`` writes the config exactly as resolved; only the launcher
        uses it, for the short-lived file its ranks TRAIN with (a private temporary folder).
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
    """Raise ConfigError for keys that are not TrainConfig fields, suggesting the nearest one."""
    valid = field_names()
    for key in keys:
        if key not in valid:
            raise ConfigError(
                f"Unknown key {key!r} in {where}.{did_you_mean(key, valid)} Valid keys: {', '.join(valid)}."
            )


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Load ``configs/runs/*.yaml`` (optional) and apply ``overrides``; validate everything.

    Raises:
        ConfigError: a missing file, an unknown key (with the nearest valid one), or an invalid value.
    """
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(
                f"Run config {str(p)!r} does not exist. Named runs live in configs/runs/*.yaml."
            )
        values = yaml.safe_load(p.read_text()) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{p} must hold a mapping of TrainConfig fields, got {type(values).__name__}.")
        check_keys(values, str(p))
    check_keys(overrides, "the overrides")
    values.update({k: v for k, v in overrides.items() if v is not None})
    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    return TrainConfig(**{k: _coerce(k, types[k], v) for k, v in values.items()})


def _coerce(key: str, type_name: str, value: Any) -> Any:
    """YAML reads ``1e-4`` as a string and ``3`` where a float is meant; convert to the field's type."""
    base = type_name.replace(" | None", "")
    if value is None or not isinstance(value, str | int | float) or isinstance(value, bool):
        return value
    try:
        if base == "float":
            return float(value)
        if base == "int" and not isinstance(value, float):
            return int(value)
    except ValueError as err:
        raise ConfigError(f"{key}={value!r} is not a valid {base}.") from err
    if base == "str":
        return str(value)
    if base == "list[str]" and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value
