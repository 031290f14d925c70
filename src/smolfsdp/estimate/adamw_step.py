"""Which AdamW step each engine builds, and the temporary tensors that step makes at the optimizer moment.

Chapter "Where the memory goes" (``notebooks/00_memory.ipynb``). torch 2.13's ``torch.optim.AdamW`` runs one of
three implementations (``torch/optim/adam.py``), and they differ in memory, not in the update:

* ``fused`` (``AdamW(fused=True)``, ``_fused_adam``): one ``torch._fused_adamw_`` call per device and dtype
  updates parameters, m and v in place; no tensor as large as a parameter is made. The TRL engine's: transformers'
  ``TrainingArguments.optim`` defaults to ``adamw_torch_fused`` with torch >= 2.8 (``training_args.py``,
  ``default_optim``; on CPU too: torch's fused kernels support ``cpu``), TRL's ``SFTConfig`` keeps that default
  and ``Trainer.get_optimizer_cls_and_kwargs`` builds ``AdamW(..., fused=True)`` from it
  (``trainer_optimizer._get_adamw_torch``).
* ``foreach`` (``_multi_tensor_adam``): ``torch._foreach_sqrt(v)`` makes one temporary as large as the param
  group's v (then divided in place and passed to ``_foreach_addcdiv_``). torch's own choice on CUDA when neither
  flag is given (``_default_to_fused_or_foreach``): the native engine's on a GPU (``train.native.make_optimizer``,
  one param group).
* ``for-loop`` (``_single_tensor_adam``): parameter by parameter, ``denom = (v.sqrt() / c).add_(eps)``: the
  square root and the quotient of one parameter at once, while the previous parameter's ``denom`` is still
  bound: ``max(previous + 2 x this)`` over the parameters in order. torch's choice off the foreach devices:
  the native engine on CPU.

:func:`engine_optimizer` says which an engine builds on a device (as ``loss_path.engine_loss_path`` says which
loss it computes); :func:`adamw_temporary_bytes` what the step adds to the optimizer moment
(``smolfsdp.estimate.moments``).

    python -c "from smolfsdp.estimate.adamw_step import engine_optimizer as e; print(e('trl'), e('native'), e('native', 'cpu'))"
"""

from __future__ import annotations

from smolfsdp.errors import ConfigError
from smolfsdp.estimate.recipes import check_choice

#: ``estimate_memory(adamw=...)``: the AdamW implementations, and what each allocates at the optimizer step.
ADAMW_IMPLS = {
    "fused": "AdamW(fused=True): one fused kernel updates p, m and v in place; no temporary",
    "foreach": "AdamW(foreach=True): _foreach_sqrt(v) makes one temporary as large as v",
    "for-loop": "AdamW(foreach=False): sqrt(v) and its quotient for one parameter at a time",
}
#: how a dry run's ``setup["optimizer"]`` names the optimizer it built (``audit.dryrun.dry_run``)
OPTIMIZER_TEXT = {
    "fused": "torch.optim.AdamW(fused=True)",
    "foreach": "torch.optim.AdamW(foreach=True)",
    "for-loop": "torch.optim.AdamW(foreach=False)",
}
#: a reader's words for each, for the settings line (``recipe_peak.settings_line``)
ADAMW_WORDS = {"fused": "fused AdamW", "foreach": "foreach AdamW", "for-loop": "for-loop AdamW"}
ENGINES = ("native", "trl")
#: transformers' ``TrainingArguments.optim`` default, as :func:`trainer_default_optim` reads it from the pinned
#: transformers (tests/test_adamw_step.py holds the two equal): a constant, so that ``smolfsdp memory`` need not
#: import ``transformers.training_args`` (accelerate, peft, half a second) to name the TRL engine's AdamW.
TRAINER_DEFAULT_OPTIM = "adamw_torch_fused"


def trainer_default_optim() -> str:
    """The ``optim`` a Trainer gets when none is passed: the default of transformers' ``TrainingArguments.optim``
    field (``"adamw_torch_fused"`` with torch >= 2.8), which TRL's ``SFTConfig`` inherits unchanged."""
    from transformers import TrainingArguments  # deferred: keeps `smolfsdp memory`'s parser light

    return str(TrainingArguments.__dataclass_fields__["optim"].default)


def torch_default_adamw(device: str) -> str:
    """torch's own choice for ``AdamW`` with neither ``foreach`` nor ``fused`` given, on ``device`` (a device
    type: ``cuda``, ``cpu``...): ``foreach`` on the foreach devices, else ``for-loop`` (``adam.adam`` calls
    ``_default_to_fused_or_foreach(..., use_fused=False)``; plain tensors, ``Parameter`` and ``DTensor``)."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices  # deferred: torch

    return "foreach" if device in _get_foreach_kernels_supported_devices() else "for-loop"


def engine_optimizer(engine: str, device: str = "cuda") -> str:
    """The AdamW implementation (a key of :data:`ADAMW_IMPLS`) a smolfsdp engine builds on ``device`` (a device
    type; ``cuda`` by default, what the estimates are for):

    * ``trl``: the Trainer's default ``optim`` (:data:`TRAINER_DEFAULT_OPTIM`, :func:`trainer_default_optim`'s;
      ``train.trl_engine.trl_args`` sets
      none): ``adamw_torch_fused`` is ``fused``, ``adamw_torch`` torch's choice (:func:`torch_default_adamw`);
    * ``native``: ``train.native.make_optimizer`` passes neither flag: torch's choice.

    Raises ConfigError for an unknown engine, ValueError for a Trainer default that is not a torch AdamW."""
    check_choice(engine, ENGINES, "engine")
    if engine == "native":
        return torch_default_adamw(device)
    optim = TRAINER_DEFAULT_OPTIM
    if optim == "adamw_torch_fused":
        return "fused"
    if optim == "adamw_torch":
        return torch_default_adamw(device)
    raise ValueError(f"transformers' default optim is {optim!r}: not a torch AdamW this estimator models")


def built_adamw(optimizer) -> str:
    """The implementation a built ``torch.optim.AdamW`` runs (its first param group's ``fused``/``foreach``;
    neither set: torch's choice for its parameters' device; accelerate's ``AcceleratedOptimizer`` is read through
    the optimizer it wraps). For ``summary.json`` and the tests: what ran."""
    group = getattr(optimizer, "optimizer", optimizer).param_groups[0]
    if group.get("fused"):
        return "fused"
    if group.get("foreach") is not None:
        return "foreach" if group["foreach"] else "for-loop"
    return torch_default_adamw(group["params"][0].device.type)


def adamw_temporary_bytes(adamw: str, shards: list[int], state_bytes: int) -> int:
    """Bytes the AdamW step of ``adamw`` holds beyond parameters, gradients and state, at its fullest (module
    docstring): ``foreach`` one v-sized temporary, ``for-loop`` ``max(previous + 2 x this)`` parameter's v,
    ``fused`` none. ``shards``: this rank's elements of each trainable parameter in the optimizer's order (one
    param group); ``state_bytes``: bytes per element of v. ConfigError for an unknown ``adamw``."""
    check_choice(adamw, tuple(ADAMW_IMPLS), "adamw")
    if adamw == "fused" or not shards:
        return 0
    if adamw == "foreach":
        return sum(shards) * state_bytes
    return max(prev + 2 * n for prev, n in zip([0, *shards], shards, strict=False)) * state_bytes


def traced_adamw(setup: dict) -> str:
    """The implementation a dry run built, from its ``setup["optimizer"]`` (:data:`OPTIMIZER_TEXT`); every
    committed row names one (the grids were traced with ``foreach``). ConfigError for another text."""
    by_text = {v: k for k, v in OPTIMIZER_TEXT.items()}
    text = setup.get("optimizer")
    if text not in by_text:
        raise ConfigError(f"a dry run's optimizer {text!r} is not one of {list(by_text)}")
    return by_text[text]
