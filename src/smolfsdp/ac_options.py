"""Activation checkpointing policies by name: which decoder layers are checkpointed, and the checks on them.

One source for the run config (``smolfsdp.config``: ``activation_checkpointing``, ``ac_mode``, ``ac_every``),
the native engine and the dry run (``smolfsdp.sharding.selective_ac`` applies them) and the memory estimate
(``smolfsdp.estimate.selective_ac_bytes`` models them). The names follow torchtitan's ``[activation_checkpoint]``
section at 9dec370 (2024-12, the commit of its H100 benchmark; ``torchtitan/parallelisms/parallelize_llama.py``).
Each trades memory for recomputation: full checkpointing recomputes most of a forward per step (not all:
torch stops before each layer's last matmul; ``smolfsdp.estimate.recompute`` counts it).

* ``full``: every decoder layer recomputed in backward (torchtitan ``mode = 'full'``).
* ``layer``: every ``ac_every``-th decoder layer recomputed, the others keep all they save (torchtitan
  ``mode = 'selective'``, ``selective_ac_option = '<k>'``: layers ``k-1, 2k-1, ...`` counting from 0).
* ``op``: every layer checkpointed with a selective policy: the outputs of chosen ops are kept, the rest is
  recomputed (torchtitan ``selective_ac_option = 'op'``; ``smolfsdp.sharding.selective_ac`` says which ops).

    python -c "from smolfsdp.ac_options import checkpointed_layers; print(checkpointed_layers(36, 'layer', 2))"
"""

from __future__ import annotations

from smolfsdp.errors import ConfigError, did_you_mean

AC_MODES = ("full", "layer", "op")


def check_ac_options(enabled: bool, mode: str, every: int | None, engine: str = "native") -> None:
    """Raise ConfigError for a policy that cannot run: an unknown ``mode``, a selective mode while
    ``enabled`` is false, ``every`` missing for (or given to a mode other than) ``layer``, ``every`` < 1, or
    a selective mode on the TRL engine (the Trainer applies full checkpointing only)."""
    if mode not in AC_MODES:
        raise ConfigError(f"ac_mode={mode!r}: use one of {AC_MODES}.{did_you_mean(mode, AC_MODES)}")
    if mode != "full" and not enabled:
        raise ConfigError(
            f"ac_mode={mode!r} selects which activations are recomputed, but activation_checkpointing is false; "
            "turn activation_checkpointing on (YAML: true; smolfsdp train: --activation_checkpointing; smolfsdp memory: "
            "--activation-checkpointing), or leave ac_mode: full."
        )
    if mode == "layer" and every is None:
        raise ConfigError("ac_mode: layer needs ac_every: k (checkpoint every k-th decoder layer, e.g. 2).")
    if mode != "layer" and every is not None:
        raise ConfigError(f"ac_every={every} applies to ac_mode: layer only (ac_mode is {mode!r}); unset it.")
    if every is not None and every < 1:
        raise ConfigError(f"ac_every={every} must be >= 1 (1 checkpoints every layer, as ac_mode: full).")
    if mode != "full" and engine != "native":
        raise ConfigError(
            f"ac_mode={mode!r} runs on the native engine only (the Trainer's FSDP activation checkpointing "
            "recomputes every layer); set engine: native, or ac_mode: full."
        )


def checkpointed_layers(n_layers: int, mode: str, every: int | None = None) -> list[int]:
    """Indices (from 0) of the decoder layers wrapped in a checkpoint: all of them for ``full`` and ``op``,
    every ``every``-th for ``layer`` (indices ``every-1, 2*every-1, ...``, torchtitan's ``_count % k == 0``
    with its count starting at 1). ValueError for an unknown ``mode``."""
    if mode in ("full", "op"):
        return list(range(n_layers))
    if mode == "layer":
        return [i for i in range(n_layers) if (i + 1) % every == 0]
    raise ValueError(f"mode={mode!r}: use one of {AC_MODES}")
