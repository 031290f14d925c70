"""How FSDP lays parameters out on each rank: FSDP1's padded ``FlatParameter`` per unit, FSDP2's
``Shard(0)`` per parameter, and the bytes of shards, gradients and optimizer state that follow.

Chapters "Where the memory goes" and "Scaling out": ``smolfsdp.estimate.memory`` sizes the static
bytes with :func:`sharded_state`, ``smolfsdp.estimate.comm`` the collectives with :func:`unit_sizes`.
Pure functions of a config (``smolfsdp.estimate.params``), no GPU.

    python -c "from smolfsdp.measure import layout, params; print(layout.unit_sizes(params.resolve_model_config('tiny'), 2))"
"""

from __future__ import annotations

from smolfsdp.estimate.params import LoraSpec, ParamSpec, model_units
from smolfsdp.estimate.recipes import Recipe


def flat_offsets(params: list[ParamSpec], align: int) -> tuple[list[int], int]:
    """FSDP1: where each parameter starts in its unit's FlatParameter, in elements (each at a multiple of
    ``align`` elements, 0: packed), and where the last one ends (before the padding to the world size)."""
    offsets, end = [], 0
    for p in params:
        if align and end % align:
            end += align - end % align
        offsets.append(end)
        end += p.numel
    return offsets, end


def flat_layout(params: list[ParamSpec], group: int, rank: int, align: int) -> tuple[int, list[int]]:
    """FSDP1: one FlatParameter per unit. With ``use_orig_params`` each parameter starts at a multiple of
    16 bytes of the compute dtype and the total is padded to a multiple of the world size
    (torch/distributed/fsdp/_flat_param.py, ``_init_flat_param_and_metadata``); each rank holds
    ``ceil(total / group)`` elements. Returns (shard numel, this rank's elements of each parameter)."""
    offsets, end = flat_offsets(params, align)
    shard = -(-end // group)
    lo, hi = rank * shard, (rank + 1) * shard
    return shard, [max(0, min(hi, o + p.numel) - max(lo, o)) for o, p in zip(offsets, params, strict=True)]


def dim0_layout(p: ParamSpec, group: int, rank: int) -> tuple[int, int]:
    """FSDP2: ``Shard(0)`` with dim 0 padded to a multiple of the group (torch.chunk sizes); every rank
    stores ``ceil(dim0 / group)`` rows. Returns (padded local numel, real local numel)."""
    rows = -(-p.dim0 // group)
    rest = p.numel // p.dim0
    return rows * rest, max(0, min(rows, p.dim0 - rank * rows)) * rest


def unit_sizes(config, group: int, fsdp_version: int = 2, compute_bytes: int = 4, use_orig_params=True):
    """Per FSDP unit (``"root"``, then each decoder layer): (padded numel all-gathered / reduce-scattered,
    real numel). The padding is exact:

    * FSDP1: one FlatParameter per unit; with ``use_orig_params`` each parameter starts at a multiple
      of 16 bytes of the compute dtype, and the total is padded to a multiple of ``group``
      (torch/distributed/fsdp/_flat_param.py, ``_init_flat_param_and_metadata``).
    * FSDP2: each parameter's dim 0 padded to a multiple of ``group`` (``_get_dim0_padded_size``,
      _fsdp_collectives.py ``foreach_all_gather`` / ``foreach_reduce``).
    """
    out = {}
    for name, params in model_units(config).items():
        real = sum(p.numel for p in params)
        if fsdp_version == 1:
            align = 16 // compute_bytes if use_orig_params else 0
            shard, _ = flat_layout(params, group, 0, align)
        else:
            shard = sum(dim0_layout(p, group, 0)[0] for p in params)
        out[name] = (shard * group, real)
    return out


def sharded_state(
    config,
    recipe: Recipe,
    group: int,
    rank: int = 0,
    fsdp_version: int = 2,
    lora: LoraSpec | None = None,
    *,
    adapter_units: bool = False,
) -> dict[str, int]:
    """Bytes of parameter shards, gradient shards, fp32 master and Adam m+v on ``rank`` of a shard group.

    Gradients exist only where autograd produces them: FSDP2 per trainable parameter; FSDP1 per
    FlatParameter that holds any trainable parameter (so a LoRA unit gets a gradient as large as its
    whole shard, frozen base included). ``adapter_units`` (FSDP1 with LoRA): each adapter is its own FSDP
    unit, as fsdp_qlora's ``train.py`` and llama-recipes wrap them, so the frozen base FlatParameter gets no
    gradient and only the adapters' elements do (their own small FlatParameters' padding is ignored). Adam state covers only the real (unpadded) elements of
    trainable parameters on the rank; its ``step`` counters (one 0-d fp32 host tensor per parameter
    with local elements) are counted in ``n_step_tensors``. ``full_units``: per unit, (full padded
    numel, whether it holds a trainable parameter). ``optimizer_shards``: this rank's elements of each trainable
    parameter in ``model.parameters()`` order (the embedding first, the root's other parameters last), the order
    a per-parameter AdamW step visits them (``adamw_step.adamw_temporary_bytes``).
    """
    out = dict.fromkeys(["params", "grads", "master", "optimizer", "n_step_tensors"], 0)
    out["full_units"], shards = {}, {}
    align = 16 // recipe.compute_bytes
    for name, params in model_units(config, lora).items():
        if fsdp_version == 1 and adapter_units and any(p.trainable for p in params):
            params = [p for p in params if not p.trainable] + [p for p in params if p.trainable]
            shard, local = _adapter_units_layout(params, group, rank, align)
            padded = sum(shard)
            out["grads"] += (
                sum(s for s, p in zip(shard, params, strict=True) if p.trainable) * recipe.grad_bytes
            )
            full = padded * group
        elif fsdp_version == 1:
            shard, local = flat_layout(params, group, rank, align)
            padded = shard
            out["grads"] += shard * recipe.grad_bytes if any(p.trainable for p in params) else 0
            full = shard * group
        else:
            layout = [dim0_layout(p, group, rank) for p in params]
            padded, local = sum(a for a, _ in layout), [b for _, b in layout]
            out["grads"] += (
                sum(a for (a, _), p in zip(layout, params, strict=True) if p.trainable) * recipe.grad_bytes
            )
            full = padded * group
        out["params"] += padded * recipe.param_bytes
        mine = [n for n, p in zip(local, params, strict=True) if p.trainable]
        out["optimizer"] += sum(mine) * 2 * recipe.state_bytes
        out["master"] += sum(mine) * recipe.master_bytes
        out["n_step_tensors"] += sum(1 for n in mine if n > 0)
        out["full_units"][name] = (full, any(p.trainable for p in params))
        shards[name] = mine  # trainable parameters keep their order in every layout
    root = shards.pop("root", [])
    out["optimizer_shards"] = root[:1] + [n for ns in shards.values() for n in ns] + root[1:]
    return out


def _adapter_units_layout(params: list[ParamSpec], group: int, rank: int, align: int):
    """FSDP1 with each adapter its own unit: one FlatParameter for the frozen parameters of the unit, one
    per adapter matrix (``params``: frozen first, then trainable). Returns (per-parameter padded shard numel,
    with the frozen FlatParameter's shard on its first parameter; this rank's real elements per parameter)."""
    frozen = [p for p in params if not p.trainable]
    f_shard, f_local = flat_layout(frozen, group, rank, align) if frozen else (0, [])
    shards = [f_shard] + [0] * (len(frozen) - 1) if frozen else []
    local = list(f_local)
    for p in params[len(frozen) :]:
        s, (n,) = flat_layout([p], group, rank, align)
        shards.append(s)
        local.append(n)
    return shards, local
