"""Checks of the run options that need this machine: is the attention kernel, the compiler or Liger there?

The fields alone are checked by :func:`smolfsdp.run_options.check_kernels`; what needs the installed packages and
the device is checked here, in one line before any rank starts (:func:`smolfsdp.launch.validate.validate` calls
:func:`check_kernels_here`, so ``smolfsdp train``, each rank and ``runner.run`` refuse the same way):

* ``attn_implementation: flash_attention_2`` / ``_3``: a CUDA GPU, and the ``flash-attn`` (FA2) or ``flash-attn-3``
  (FA3) distribution, or the ``kernels`` package, with which transformers 5.x falls back to the Hub's
  ``kernels-community/flash-attn2`` / ``vllm-flash-attn3`` (``PreTrainedModel._check_and_adjust_attn_implementation``;
  the same distribution names as ``transformers.utils.is_flash_attn_2_available`` reads).
* a hub kernel (``org/name``, e.g. ``kernels-community/flash-attn2``): the ``kernels`` package.
* ``torch_compile``: what inductor compiles with: a C++ compiler on CPU (``$CXX``, ``g++``, ``c++`` or ``clang++``),
  Triton's toolchain on GPUs (:func:`smolfsdp.launch.host_checks.triton_toolchain_missing`).
* ``use_liger_kernel``: a CUDA GPU (Liger's kernels are Triton GPU kernels) and the ``liger-kernel`` distribution.

    python -c "from smolfsdp.config import TrainConfig; from smolfsdp.launch.kernel_checks import check_kernels_here; \
check_kernels_here(TrainConfig(use_liger_kernel=True))"
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from importlib import metadata

from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError
from smolfsdp.launch.host_checks import triton_toolchain_missing

#: The distribution that ships each flash-attention version (transformers 5.x's ``is_flash_attn_2_available`` and
#: ``is_flash_attn_3_available`` read the same names), and the ``pip install`` that brings it.
FLASH_DISTRIBUTIONS = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3"}


def installed(distribution: str) -> bool:
    """Whether ``distribution`` (a pip name such as ``liger-kernel``) is installed: its metadata, no import."""
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _cuda_gpus() -> int:
    import torch  # deferred: the callers already loaded it (validate imports the mesh code)

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cxx_compiler_missing() -> bool:
    """True when inductor finds no C++ compiler for CPU code (``$CXX``, ``g++``, ``c++``, ``clang++``)."""
    names = filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++"))
    return not any(shutil.which(c) for c in names)


def check_kernels_here(
    cfg: TrainConfig,
    *,
    gpu_count: int | None = None,
    has: Callable[[str], bool] = installed,
    toolchain_missing: Callable[[], list[str]] = triton_toolchain_missing,
    cxx_missing: Callable[[], bool] = cxx_compiler_missing,
) -> None:
    """Refuse, in one line, a run option this machine cannot honour (the module docstring lists them).

    ``gpu_count`` (default: this machine's CUDA GPUs), ``has`` (is a distribution installed), ``toolchain_missing``
    and ``cxx_missing`` are this machine's answers unless a test gives others. Raises ConfigError naming what is
    missing and the fix."""
    name, on_gpu = cfg.attn_implementation, None
    if name in FLASH_DISTRIBUTIONS or cfg.use_liger_kernel or cfg.torch_compile:
        on_gpu = (_cuda_gpus() if gpu_count is None else gpu_count) > 0
    if name in FLASH_DISTRIBUTIONS:
        dist = FLASH_DISTRIBUTIONS[name]
        if not on_gpu:
            raise ConfigError(
                f"attn_implementation={name} runs on CUDA GPUs only and this machine has none; use "
                "attn_implementation: sdpa (or leave it unset) here."
            )
        if not has(dist) and not has("kernels"):
            raise ConfigError(
                f"attn_implementation={name} needs the {dist} package (pip install {dist}), or the kernels package "
                "(pip install kernels: transformers then loads the Hub's flash-attention kernel); neither is "
                "installed. Or use attn_implementation: sdpa."
            )
    elif name is not None and "/" in name and not has("kernels"):
        raise ConfigError(
            f"attn_implementation={name} is a Hub kernel: transformers loads it with the kernels package, which is "
            "not installed (pip install kernels); or use attn_implementation: sdpa."
        )
    if cfg.use_liger_kernel:
        if not on_gpu:
            raise ConfigError(
                "use_liger_kernel: Liger's kernels are Triton GPU kernels and this machine has no CUDA GPU; set "
                "use_liger_kernel: false here."
            )
        if not has("liger-kernel"):
            raise ConfigError(
                "use_liger_kernel: the liger-kernel package is not installed (pip install liger-kernel); or set "
                "use_liger_kernel: false."
            )
    if cfg.torch_compile:
        missing = (
            toolchain_missing()
            if on_gpu
            else (["a C++ compiler (g++, c++ or clang++; or set CXX)"] if cxx_missing() else [])
        )
        if missing:
            raise ConfigError(
                f"torch_compile: inductor compiles the model's kernels at the first step and this machine lacks "
                f"{', '.join(missing)}; install them, or set torch_compile: false."
            )
