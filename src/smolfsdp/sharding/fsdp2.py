"""FSDP2: ``fully_shard`` per decoder layer, then the root (torchtitan's ``apply_fsdp`` shape).

FSDP2 keeps every parameter as a ``DTensor`` sharded on dim 0 (``Shard(0)``) over a device mesh;
no FlatParameter. On a 2-D mesh (``dp_replicate`` x ``dp_shard``) the same call gives HSDP: each
parameter is ``(Replicate(), Shard(0))``, sharded within a group and replicated across groups, and
gradients are reduce-scattered in the group, then all-reduced across groups. Used by the fine-tune,
FSDP1-vs-FSDP2, LoRA and multi-node chapters.

    torchrun --nproc-per-node 2 -m smolfsdp.cli train --engine native --fsdp_version 2
    torchrun --nproc-per-node 4 -m smolfsdp.cli train --fsdp_version 2 --nproc 4 \
        --sharding_strategy HYBRID_SHARD --replicate_size 2          # HSDP on a 2 x 2 mesh
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from smolfsdp.errors import ConfigError, did_you_mean


def apply_fsdp2(
    model: nn.Module,
    mesh,
    wrap_cls: type[nn.Module],
    *,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload_policy: CPUOffloadPolicy | None = None,
    reshard_after_forward: bool = True,
    root_reshard_after_forward: bool = False,
) -> nn.Module:
    """Shard ``model`` in place: ``fully_shard`` each ``wrap_cls`` module, then the root.

    The root group holds what no layer owns: the embedding, the final norm and ``lm_head``. SmolLM3
    ties ``lm_head.weight`` to ``embed_tokens.weight``, so both stay in that one group and stay tied.

    Args:
        mesh: a 1-D ``DeviceMesh`` over all ranks (FULL_SHARD), or a 2-D one (``dp_replicate``,
            ``dp_shard``) from :func:`build_mesh` for HSDP (NO_SHARD is the 2-D mesh with shard size 1).
        mp_policy: e.g. ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``.
        offload_policy: ``CPUOffloadPolicy(pin_memory=...)`` keeps shards and optimizer state on the host.
        reshard_after_forward: free gathered layers after forward (ZeRO-3) or keep them to backward (ZeRO-2).
        root_reshard_after_forward: the same for the root group (embedding, final norm, ``lm_head``).
            Default False, as PyTorch's ``fully_shard`` docstring advises ("we usually set False for the
            root module, because the root module is typically required immediately when the backward
            pass begins") and as its ``None`` default does for the root. Measured on the tiny SmolLM3
            (chapter "FSDP mechanics", ``smolfsdp.probes.step``): resharding the root adds one
            all-gather of the whole root group per step (10 all-gathers for 4 layers + root instead of
            9), the same loss, and a peak one root group higher, not lower: the root is needed again
            as soon as backward starts (``lm_head`` first), so nothing is freed while memory peaks.
    Returns the same module, now an ``FSDPModule``; a peft model's ``generate`` is registered as an FSDP
    forward method, so ``model.generate(...)`` works sharded (a collective: every rank calls it).
    """
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if offload_policy is not None:
        kwargs["offload_policy"] = offload_policy
    for module in [m for m in model.modules() if isinstance(m, wrap_cls)]:
        fully_shard(module, **kwargs)
    # Explicit, not None: an explicit value for the layers must not reach the root (torch then reshards it).
    fully_shard(model, **{**kwargs, "reshard_after_forward": root_reshard_after_forward})
    if hasattr(model, "peft_config") and hasattr(model, "generate"):
        # peft's PeftModel.generate calls the inner model directly, so the root's forward hooks never
        # gather the root group (embedding, lm_head): "mixed torch.Tensor and DTensor". Registering
        # generate runs those hooks around the whole call (torch.distributed.fsdp.register_fsdp_forward_method).
        register_fsdp_forward_method(model, "generate")
    return model


#: FSDP1's ``ShardingStrategy`` names, which the config uses for both FSDP versions (FSDP2 spells them
#: as a mesh shape and ``reshard_after_forward``; see :func:`resolve_mesh_shape`).
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
MESH_DIM_NAMES = ("dp_replicate", "dp_shard")


def resolve_mesh_shape(
    sharding_strategy: str,
    world_size: int,
    replicate_size: int | None = None,
    shard_size: int | None = None,
    local_world_size: int | None = None,
) -> tuple[int, int]:
    """The ``(replicate, shard)`` shape of the data-parallel mesh for a sharding strategy.

    ``replicate`` ranks hold the same shard (gradients all-reduced among them); ``shard`` ranks split
    each parameter (all-gather / reduce-scatter among them); ``replicate * shard == world_size``.

    * FULL_SHARD, SHARD_GRAD_OP: ``(1, world_size)``: every rank holds ``1/world_size`` of each parameter.
    * NO_SHARD: ``(world_size, 1)``: every rank holds the whole model (DDP); FSDP2 runs it as HSDP with
      a shard dimension of size 1.
    * HYBRID_SHARD: shard within a group, replicate across groups (HSDP). Give ``replicate_size``,
      ``shard_size`` or both; with neither, shard over the ``local_world_size`` processes of a node
      (torchrun's ``LOCAL_WORLD_SIZE``) and replicate across nodes, as FSDP1 does by default.

    Args:
        world_size: ranks in the job (nodes x processes per node).
        replicate_size, shard_size: ``None`` = derived from the strategy and the world size.
        local_world_size: processes per node; only read for HYBRID_SHARD with no size given.
    Raises:
        ConfigError: an unknown strategy, a size below 1, a size the strategy does not allow, a size
            that does not divide ``world_size``, or a shape whose product is not ``world_size``.
    """
    strategy = str(sharding_strategy).upper()
    if strategy not in SHARDING_STRATEGIES:
        raise ConfigError(
            f"sharding_strategy={sharding_strategy!r} is not known; use one of {SHARDING_STRATEGIES}."
            + did_you_mean(strategy, SHARDING_STRATEGIES)
        )
    for name, size in (("replicate_size", replicate_size), ("shard_size", shard_size)):
        if size is not None and int(size) < 1:
            raise ConfigError(f"{name}={size} must be >= 1 (or unset, to derive it from the world size).")
    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        if replicate_size not in (None, 1):
            raise ConfigError(
                f"replicate_size={replicate_size} with sharding_strategy={strategy}: replicating shards across "
                "groups is HSDP; set sharding_strategy: HYBRID_SHARD, or drop replicate_size."
            )
        shape = (1, world_size if shard_size is None else int(shard_size))
    elif strategy == "NO_SHARD":
        if shard_size not in (None, 1):
            raise ConfigError(
                f"shard_size={shard_size} with sharding_strategy=NO_SHARD: NO_SHARD keeps whole parameters on "
                "every rank; use HYBRID_SHARD to shard within groups, or drop shard_size."
            )
        shape = (world_size if replicate_size is None else int(replicate_size), 1)
    elif replicate_size is not None and shard_size is not None:
        shape = (int(replicate_size), int(shard_size))
    else:
        if replicate_size is None and shard_size is None:
            shard_size = local_world_size or world_size
        given, size = (
            ("replicate_size", int(replicate_size))
            if replicate_size is not None
            else ("shard_size", int(shard_size))
        )
        if world_size % size:
            raise ConfigError(
                f"HYBRID_SHARD: {given}={size} does not divide the world size {world_size}, so the ranks cannot "
                f"form equal groups; use a divisor of {world_size} (e.g. {_divisors(world_size)})."
            )
        shape = (size, world_size // size) if given == "replicate_size" else (world_size // size, size)
    if shape[0] * shape[1] != world_size:
        raise ConfigError(
            f"the mesh {shape[0]} x {shape[1]} (replicate_size x shard_size) = {shape[0] * shape[1]} ranks does "
            f"not match the world size {world_size}; make replicate_size x shard_size = {world_size} "
            f"(or leave one of them unset), or launch {shape[0] * shape[1]} processes (nproc)."
        )
    return shape


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def build_mesh(device_type: str, shard_size: int, replicate_size: int | None = None):
    """A 1-D mesh (``dp_shard``), or with ``replicate_size`` given, a 2-D mesh (``dp_replicate``, ``dp_shard``).

    Ranks are laid out row-major: with 4 ranks and ``replicate_size=2``, the shard groups are
    {0, 1} and {2, 3} (one per node when ranks are numbered node by node) and the replicate groups
    {0, 2} and {1, 3}. ``fully_shard`` on the 2-D mesh places parameters as ``(Replicate(), Shard(0))``
    (HSDP); FSDP1's ``HYBRID_SHARD`` takes the same mesh (``device_mesh=``, replicate dim first).

    Raises ConfigError when ``replicate_size x shard_size`` is not the process group's world size
    (:func:`check_mesh_size`).
    """
    check_mesh_size(shard_size, replicate_size)
    shape, names = (
        ((replicate_size, shard_size), MESH_DIM_NAMES)
        if replicate_size
        else ((shard_size,), MESH_DIM_NAMES[1:])
    )
    # A mesh is bookkeeping (lists of ranks), never model memory: under the full-size dry run's
    # FakeTensorMode (smolfsdp.audit.dryrun) its rank tensor must still be real, or reading it back fails.
    with unset_fake_temporarily():
        return init_device_mesh(device_type, shape, mesh_dim_names=names)


def check_mesh_size(shard_size: int, replicate_size: int | None = None) -> None:
    """Raise ConfigError unless ``replicate_size x shard_size`` (``replicate_size`` None counts as 1) is the
    process group's world size, saying which is larger and how to make them agree."""
    world = dist.get_world_size()
    size = shard_size * (replicate_size or 1)
    if size != world:
        relation = "larger" if size > world else "smaller"
        raise ConfigError(
            f"a mesh of {replicate_size or 1} x {shard_size} = {size} ranks is {relation} than the world size "
            f"{world}; make replicate_size x shard_size = {world}, or launch {size} processes."
        )


def make_offload_policy(pin_memory: bool | None = None) -> CPUOffloadPolicy:
    """``CPUOffloadPolicy``; pinned host memory only where CUDA exists (pinning needs a CUDA driver).

    Raises ConfigError when pinned memory is asked for on a machine without CUDA.
    """
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    if pin_memory and not torch.cuda.is_available():
        raise ConfigError(
            "CPU offload with pin_memory=True needs CUDA (page-locked host memory is a CUDA driver "
            "feature); on this machine use pin_memory=False."
        )
    return CPUOffloadPolicy(pin_memory=pin_memory)


def default_mp_policy(mixed_precision: str) -> MixedPrecisionPolicy | None:
    """bf16 compute with fp32 gradient reduction (torchtitan's default), or None for plain fp32.

    Why: bf16 all-gathers and matmuls halve communication and use tensor cores, while reducing
    gradients in fp32 keeps the sum over ranks from losing the low bits (bf16 has an 8-bit
    mantissa); the sharded parameters and optimizer state stay fp32.
    """
    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def local_numel(model: nn.Module) -> int:
    """Elements of the parameter shards this rank holds (tied parameters counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return total


def describe_sharding(model: nn.Module) -> pd.DataFrame:
    """One row per parameter: name, type, placement, local/global shape and numel, dtype, requires_grad."""
    rows = []
    for name, p in model.named_parameters():
        is_dt = isinstance(p, DTensor)
        local = p.to_local() if is_dt else p
        rows.append(
            {
                "name": name,
                "type": "DTensor" if is_dt else type(p).__name__,
                "placement": str(tuple(p.placements)) if is_dt else "",
                "local_shape": tuple(local.shape),
                "global_shape": tuple(p.shape),
                "local_numel": local.numel(),
                "global_numel": p.numel(),
                "dtype": str(p.dtype).replace("torch.", ""),
                "requires_grad": p.requires_grad,
            }
        )
    return pd.DataFrame(rows)
