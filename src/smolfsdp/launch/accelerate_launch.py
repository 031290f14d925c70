"""``smolfsdp train --accelerate_config F``: the ranks started by ``accelerate launch --config_file F`` after every
check ``smolfsdp train`` makes (GPUs, the Hub, cores, memory, disk). Typed by hand, ``accelerate launch ... -m
smolfsdp.cli train`` starts the ranks first, so a refusal arrives once per rank inside accelerate's
ChildFailedError report; through this option it is one line before any rank starts."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError


def check_accelerate_config(cfg: TrainConfig, path: str | Path) -> int:
    """The process count of an ``accelerate launch`` config file, checked against ``cfg.nproc`` and ``nnodes``.

    Raises:
        ConfigError: the file is missing or not YAML, its ``distributed_type`` is not MULTI_GPU / FSDP (or
            ``use_cpu`` is set: accelerate would start one process), or its ``num_processes`` (accelerate's total over all
            machines) or ``num_machines`` differs from ``cfg.nproc`` / ``cfg.nnodes``.
    """
    try:
        conf = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(
            f"--accelerate_config {path}: cannot read it ({err}); give an accelerate YAML"
        ) from err
    if (
        not isinstance(conf, dict)
        or conf.get("distributed_type") not in ("MULTI_GPU", "FSDP")
        or conf.get("use_cpu")
    ):
        kind = conf.get("distributed_type") if isinstance(conf, dict) else type(conf).__name__
        raise ConfigError(  # accelerate.commands.launch.launch_command: only these reach multi_gpu_launcher
            f"--accelerate_config {path} has distributed_type={kind}: accelerate launches that with its simple "
            "launcher (one process; MULTI_CPU ranks need mpirun). Give a MULTI_GPU config (configs/accelerate/"
            "2gpu.yaml), or leave --accelerate_config out: smolfsdp train starts CPU ranks with torchrun"
        )
    got, machines = conf.get("num_processes", 1), conf.get("num_machines", 1)
    if (got, machines) != (cfg.nproc, cfg.nnodes):  # accelerate's num_processes is the total, as nproc
        raise ConfigError(
            f"--accelerate_config {path} starts num_processes={got} on num_machines={machines}, but the run has "
            f"nproc={cfg.nproc} on nnodes={cfg.nnodes}; make them equal (e.g. --nproc {got} --nnodes {machines})"
        )
    return got


def accelerate_command(
    cfg: TrainConfig, path: str | Path, args: list[str], module: str = "smolfsdp.cli"
) -> list[str]:
    """``python -m accelerate.commands.launch --config_file PATH -m MODULE ARGS`` (what ``accelerate launch``
    runs), after :func:`check_accelerate_config`."""
    check_accelerate_config(cfg, path)
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(path),
        "-m",
        module,
        *args,
    ]
