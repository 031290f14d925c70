"""Checks of a run configuration that need more than the config module knows, composed where a run starts.

:class:`smolfsdp.config.TrainConfig` checks types, ranges and field combinations by itself; :func:`validate`
adds what needs the layers above it: the model name and ``wrap_class`` spelling
(:mod:`smolfsdp.models.modeling`), the sharding strategy against the mesh (:mod:`smolfsdp.sharding.fsdp2`)
the node and rendezvous fields (:func:`check_launch`) and the run options this machine must support
(:mod:`smolfsdp.launch.kernel_checks`: attention kernel, compiler, Liger). ``smolfsdp train``/``bench``,
:func:`smolfsdp.launch.runner.preflight` and :func:`smolfsdp.launch.runner.run` call it before any
expensive work, so a bad value fails in milliseconds with the same message as before.

    python -c "from smolfsdp.config import load_config; from smolfsdp.launch.validate import validate; \
validate(load_config(model='tiyn'))"
"""

from __future__ import annotations

import re

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch.kernel_checks import check_kernels_here
from smolfsdp.launch.torchrun import parse_endpoint
from smolfsdp.models.modeling import check_model_name, normalise_wrap_class_name
from smolfsdp.sharding.fsdp2 import resolve_mesh_shape


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check ``cfg`` against the launcher, the mesh and the model presets; return it (``wrap_class`` tidied).

    Raises:
        ConfigError: from :func:`check_launch`, :func:`check_sharding`,
            :func:`smolfsdp.models.modeling.check_model_name`, ``normalise_wrap_class_name`` or
            :func:`smolfsdp.launch.kernel_checks.check_kernels_here`, each naming the problem and the fix.
    """
    check_run_name(cfg.name)
    check_launch(cfg)
    check_sharding(cfg)
    check_model_name(cfg.model)
    check_kernels_here(
        cfg
    )  # attention kernel, compiler, Liger: installed here, and a GPU where they need one
    if cfg.wrap_class is not None:
        cfg.wrap_class = normalise_wrap_class_name(cfg.wrap_class)
    return cfg


#: The longest run name: the run folder, its lock file (``.<name>.lock``) and the folders chapters derive
#: from it (``<name>_resumed``) stay far below the 255-byte file-name limit of common filesystems.
MAX_NAME_CHARS = 100
#: POSIX's portable file-name characters: the same folder name on every filesystem and shell.
_PORTABLE = re.compile(r"[A-Za-z0-9._-]+")


def check_run_name(name: str) -> None:
    """A run name is at most :data:`MAX_NAME_CHARS` portable characters (letters, digits, ``._-``).

    Raises:
        ConfigError: naming the length or the first character that is not portable, and the fix.
    """
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(
            f"name={name[:20]!r}... is {len(name)} characters; a run name is a folder name of at most "
            f"{MAX_NAME_CHARS}: give a shorter --name."
        )
    if not _PORTABLE.fullmatch(name):
        bad = next(c for c in name if not _PORTABLE.fullmatch(c))
        raise ConfigError(
            f"name={name!r} holds {bad!r}; a run name uses letters, digits, '.', '_' and '-' only (the same "
            "folder on every filesystem and shell): e.g. --name lora_r16."
        )


def check_launch(cfg: TrainConfig) -> None:
    """Validate the launch fields of ``cfg`` (part of :func:`validate`).

    Raises:
        ConfigError: ``nnodes`` < 1 or not dividing ``nproc``; ``node_rank`` outside ``[0, nnodes)``;
            several nodes without ``rdzv_endpoint``; an endpoint that is not ``host:port``;
            negative ``max_restarts``; non-positive timeouts.
    """
    if cfg.nnodes < 1:
        raise ConfigError(f"nnodes={cfg.nnodes}: need at least one node.")
    if cfg.nproc % cfg.nnodes:
        lo, hi = (cfg.nproc // cfg.nnodes) * cfg.nnodes, -(-cfg.nproc // cfg.nnodes) * cfg.nnodes
        raise ConfigError(
            f"nproc={cfg.nproc} processes cannot be split evenly over nnodes={cfg.nnodes} nodes: nproc is the "
            f"total (world size) and every node starts nproc/nnodes. Use nproc={hi}"
            + (f" or {lo}" if lo else "")
            + ", or another node count."
        )
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise ConfigError(
            f"node_rank={cfg.node_rank}: must be in 0..{cfg.nnodes - 1} for nnodes={cfg.nnodes}."
        )
    if cfg.nnodes > 1:
        if not cfg.rdzv_endpoint:
            raise ConfigError(
                f"nnodes={cfg.nnodes} needs rdzv_endpoint=host:port: the address of node_rank 0, where the "
                "rendezvous runs (e.g. --rdzv-endpoint node0:29400)."
            )
        parse_endpoint(cfg.rdzv_endpoint)
    if cfg.max_restarts < 0:
        raise ConfigError(f"max_restarts={cfg.max_restarts} must be >= 0 (0: a failed rank ends the run).")
    for name in ("rdzv_timeout_s", "collective_timeout_s"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be > 0 seconds.")


def check_sharding(cfg: TrainConfig) -> None:
    """Strategy name, mesh sizes and engine support; the mesh is checked against ``nproc`` here
    (the processes smolfsdp launches) and against the real world size again in ``build_mesh``.

    Raises:
        ConfigError: an unknown strategy or a mesh that does not fit ``nproc``
            (:func:`smolfsdp.sharding.fsdp2.resolve_mesh_shape`); HSDP or NO_SHARD that the TRL engine
            cannot run as asked.
    """
    world = cfg.nproc  # one node: smolfsdp launches torchrun --standalone --nproc-per-node nproc
    resolve_mesh_shape(cfg.sharding_strategy, world, cfg.replicate_size, cfg.shard_size, world)
    if cfg.engine == "trl" and cfg.sharding_strategy in ("HYBRID_SHARD", "NO_SHARD"):
        if cfg.fsdp_version == 2:
            raise ConfigError(
                f"sharding_strategy={cfg.sharding_strategy} with engine: trl and fsdp_version: 2: the "
                "Trainer's FSDP2 takes only reshard_after_forward true/false in fsdp_config (HSDP needs "
                "accelerate's ParallelismConfig). Use engine: native, or fsdp_version: 1."
            )
        if cfg.replicate_size is not None or cfg.shard_size is not None:
            raise ConfigError(
                "replicate_size/shard_size with engine: trl: the Trainer's FSDP1 builds the HYBRID_SHARD "
                "groups itself (shard over the GPUs of a node, replicate across nodes); leave both unset, "
                "or use engine: native to choose the mesh."
            )
