"""The gotcha catalogue: what a gotcha is, how its two forms are recorded, and every gotcha's name, title,
how it runs and explanation, in the chapter's order. Loads without torch (``smolfsdp gotchas --list``
reads only this); the cases' code attaches itself from ``smolfsdp.gotchas.cases_distributed`` and
``smolfsdp.gotchas.cases_local``, their shared builders are in ``smolfsdp.gotchas.builders``.

Used by the chapter "Debugging the seams" through ``smolfsdp.gotchas.run_all`` (which runs them).

    python -c "from smolfsdp.gotchas import registry as r; print(r.format_list())"
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DIST, LOCAL, CRASH = "dist", "local", "crash"  # how a gotcha runs: 2 ranks, 1 process, own launch
WRONG = "wrong result"  # outcome of a form that raised nothing but measurably did the wrong thing


@dataclass
class Gotcha:
    name: str
    title: str
    kind: str
    explanation: str
    fn: Any = field(repr=False, default=None)
    thread: str = ""  # the public report (issue or pull request) a users' problem comes from


@dataclass
class GotchaResult:
    name: str
    title: str
    failing: dict[str, Any]
    fixed: dict[str, Any]
    explanation: str
    versions: dict[str, str]
    # the fix a seed (one of the book's source posts) gave, where it differs from ours and was run too
    seed_fix: dict[str, Any] | None = None
    thread: str = ""  # Gotcha.thread: where users reported it


GOTCHAS: dict[str, Gotcha] = {}  # the catalogue below, in the chapter's order; ``fn`` set by the cases


def _entry(name: str, title: str, kind: str, explanation: str, thread: str = "") -> None:
    GOTCHAS[name] = Gotcha(name, title, kind, " ".join(explanation.split()), thread=thread)


def gotcha(name: str):
    """Decorator of a case function (in the case modules): attach it to catalogue entry ``name``.

    Raises KeyError for a name the catalogue does not hold (a case without its title and explanation).
    """

    def register(fn):
        if name not in GOTCHAS:
            raise KeyError(f"gotcha {name!r} has no catalogue entry in smolfsdp.gotchas.registry")
        GOTCHAS[name].fn = fn
        return fn

    return register


def attempt(fn, *args, **kwargs) -> dict[str, Any]:
    """Run ``fn``: ``{"outcome": "ok", **measured}`` or ``{"outcome": "error", "error", "message"}``."""
    try:
        measured = fn(*args, **kwargs)
    except Exception as err:  # recorded, not hidden: the failing form is expected to raise
        lines = str(err).strip().splitlines() or [""]
        return {"outcome": "error", "error": type(err).__name__, "message": lines[0]}
    return {"outcome": "ok", **(measured or {})}


KIND_LEGEND = {
    DIST: "runs in 2 processes (torchrun, gloo), both forms in one launch",
    LOCAL: "runs in this process, no process group",
    CRASH: "the failing form kills the process (e.g. SIGSEGV), so each form gets its own launch",
}


def format_list(as_json: bool = False) -> str:
    """``gotchas --list``: name, how it runs, title; a legend of the ``how`` column; or JSON."""
    if as_json:
        rows = [
            {"name": g.name, "how": g.kind, "how_means": KIND_LEGEND[g.kind], "title": g.title}
            for g in GOTCHAS.values()
        ]
        return json.dumps(rows, indent=2)
    lines = [f"{'name':<30} {'how':<6} title"]
    lines += [f"{g.name:<30} {g.kind:<6} {g.title}" for g in GOTCHAS.values()]
    lines.append("\nhow (the column above):")
    lines += [f"  {k:<6} {v}" for k, v in KIND_LEGEND.items()]
    lines.append("run one: smolfsdp gotchas --run NAME [--json]; all: --run all")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- the catalogue
# name, title, how it runs, what goes wrong and the fix; the cases are in cases_distributed (DIST,
# first in the chapter) and cases_local (LOCAL and CRASH), which need torch: this list does not.
_entry(
    "fsdp2_mixed_dtensor",
    "FSDP2: 'mixed torch.Tensor and DTensor' around evaluation",
    DIST,
    """With torch 2.13 an eval forward through the root (no_grad or not) and unshard() leave
    training working, and so does generate() on a plain transformers model (it calls the root's
    forward). generate() on a peft (LoRA) model is this gotcha: PeftModel.generate calls the inner model
    past the root's hooks and fails with the same error; smolfsdp.sharding.fsdp2.apply_fsdp2 registers it with
    torch.distributed.fsdp.register_fsdp_forward_method, so it works. Under FSDP1, model.generate fails
    with or without LoRA ("'weight' must be 2-D"); smolfsdp.sharding.lora.generate gathers the full
    parameters for the call (summon_full_params). What still fails is calling a submodule that FSDP2 did not
    shard on its own (here model.model, the inner SmolLM3Model, e.g. to get hidden states for an eval
    metric): the embedding's weight belongs to the root's group and is still a sharded DTensor, the
    input ids are a plain Tensor. Pinning FSDP1 (the seed's fix) does not help in this form: FSDP1
    fails too, with a shape error on the 1-D sharded view. The FSDP2 fix is to gather the root
    group around the call (model.unshard() ... model.reshard()) or to go through the root forward
    (output_hidden_states=True); for FSDP1, FSDP.summon_full_params(model, recurse=False).""",
)

_entry(
    "wrap_class",
    "A wrap class the model does not have, and a policy that wraps nothing",
    DIST,
    """A misspelt wrap class is caught by smolfsdp.models.modeling.resolve_wrap_class, which names the
    closest class. The quiet failure is a policy whose class is real but not in this model (here
    LlamaDecoderLayer): FSDP1's transformer_auto_wrap_policy matches nothing, the root becomes the
    only unit, the model is one FlatParameter gathered at once, and no error is raised.
    smolfsdp.gotchas.cases_distributed.check_wrapping counts the units and refuses that.""",
)

_entry(
    "trainer_fsdp_is_ddp",
    "The Trainer's FSDP silently runs as DDP on CPU",
    DIST,
    """TrainingArguments(fsdp=..., use_cpu=True) on 2 processes trains without a word, but
    accelerate 1.15 keeps an FSDP plugin only for accelerator devices: the model is wrapped in
    DistributedDataParallel and every rank holds all parameters. smolfsdp.train.trl_engine.detect_effective reads
    what the Trainer really built. The fix: smolfsdp.train.accelerate_cpu_fsdp lifts exactly that gate (and
    gives FSDP a plain cpu device), and the same Trainer then wraps FullyShardedDataParallel units.""",
)

_entry(
    "gradient_checkpointing",
    "HF gradient_checkpointing with FSDP vs FSDP's own activation checkpointing",
    DIST,
    """Counted with torch.profiler over one forward+backward (c10d collectives, rank 0), after
    checking that recomputation really happens (decoder-layer forward calls per step). With torch
    2.13 neither FSDP1 nor FSDP2 issues an extra all-gather for HF gradient_checkpointing: both skip
    the gather when the recomputed forward runs inside backward. The redundant all-gather the
    transformers docs warn about does not show in this setup; FSDP's own activation checkpointing
    (checkpoint_wrapper inside each unit) stays the recommended form: it is what FSDP tests.""",
)

_entry(
    "tied_embeddings",
    "Tied embeddings placed in separate FSDP2 groups",
    DIST,
    """SmolLM3 ties lm_head.weight to embed_tokens.weight (one Parameter). fully_shard(model.lm_head)
    on its own puts that Parameter in a second group; with torch 2.13 the root's fully_shard then
    refuses loudly (we have not measured what older releases did). Keep both in the
    root group, as smolfsdp.sharding.fsdp2.apply_fsdp2 does: after a step they are still one tensor.""",
)

_entry(
    "optimizer_before_sharding",
    "The optimizer created before sharding",
    DIST,
    """fully_shard replaces every parameter with a new DTensor Parameter. An optimizer built before
    holds the old tensors, which never receive a gradient: step() runs, the loss is computed, and
    no weight changes. Build the optimizer from model.parameters() after sharding.""",
)

_entry(
    "peft_fp32_adapters_fsdp1",
    "peft's fp32 adapters on a bf16 base and FSDP1's one-dtype FlatParameter",
    DIST,
    """peft (autocast_adapter_dtype=True, its default) keeps LoRA weights in fp32 on a bf16 base.
    FSDP1 flattens every unit's parameters into one FlatParameter, which needs one dtype, so
    wrapping fails. Fixes: keep adapters in the base dtype (autocast_adapter_dtype=False), load the
    base in fp32 with MixedPrecision for compute, or use FSDP2 (per-parameter DTensors).""",
)

_entry(
    "checkpoint_disk_full",
    "A checkpoint that does not fit on the disk",
    LOCAL,
    """Saving into a filesystem smaller than the checkpoint fails part-way, after the training it
    was meant to keep (torch.save's zip writer raises RuntimeError on the short write), and leaves
    a partial file where the checkpoint should be. The fix checks before
    training: smolfsdp.checkpoint.dcp.estimate_checkpoint_bytes (weights + AdamW state) against the free
    bytes of the output directory's own filesystem, and refuses with both numbers (DiskSpaceError).
    Shown on a tmpfs of half the estimate (needs root to mount; skipped otherwise).""",
)

_entry(
    "tracker_wrong_project",
    "Metrics logged to the wrong place (trackio)",
    LOCAL,
    """A hand-made trackio.init(project=...) before the Trainer does not route the Trainer's
    metrics: TrackioCallback calls trackio.init itself with TrainingArguments.project (default
    "huggingface"), which replaces the hand-made run; the metrics land in "huggingface" and the
    script's own trackio.finish() then raises. transformers 5.24's callback reads no TRACKIO_*
    environment variable for the project: it reads args.project and args.trackio_space_id. The fix
    is project=... in TrainingArguments/SFTConfig and no second session; TRACKIO_DIR (read by trackio
    at import) chooses the local store.""",
)

_entry(
    "fsdp1_cpu_offload_state_dict",
    "FSDP1 full state dict with cpu_offload=True on a CPU-only gloo run",
    CRASH,
    """get_model_state_dict(model, StateDictOptions(full_state_dict=True, cpu_offload=True)) on
    FSDP1 with gloo and no GPU kills rank 0 with SIGSEGV (exit code -11) in torch 2.13: a real
    crash, not an exception, so it is run in its own launch. On CPU the gathered tensors are in host
    memory already: pass cpu_offload only when the device is CUDA (smolfsdp.train.export.save_final_model).""",
)

# ------------------------------------------------------------------ problems users reported (issue threads)
# cases in cases_reported and cases_collectives; the ones that need a GPU are explained in ``explained``.
REPORTED = (
    "forward_before_optimizer", "qlora_integer_storage", "kv_cache_checkpointing", "state_dict_one_rank",
    "rank0_works_alone", "clip_grad_norm_fsdp1", "bf16_weights_lose_updates",
)  # fmt: skip

_entry(
    "forward_before_optimizer",
    "FSDP2: a forward before the optimizer, and parameters that never train",
    DIST,
    """FSDP2 keeps the root group (here the tied embed_tokens/lm_head and the final norm) gathered after
    its forward: torch 2.13 does not reshard the root after forward unless asked (backward needs it at
    once), and apply_fsdp2 keeps root_reshard_after_forward=False for the same reason. While gathered, the
    modules' attributes are plain tensors (FSDPParam.to_unsharded), so an optimizer built then from
    model.parameters() holds those, not the sharded DTensors. Backward reduce-scatters each gradient onto the
    DTensor shard and clears the gathered tensor's, so step() finds no gradient on what it holds and the
    shards are never updated: the loss falls (the decoder layers train) while the embedding and the final norm
    stay bit-for-bit what they were. The 'where' row gives the two lines of the installed torch. Fix: build the
    optimizer right after sharding, before any forward (torchtitan's order, and smolfsdp's engines), or call
    model.reshard() first (the last row of the fixed column).""",
    thread="https://github.com/pytorch/pytorch/issues/149205",
)

_entry(
    "qlora_integer_storage",
    "QLoRA under FSDP1: 'Cannot flatten integer dtype tensors'",
    DIST,
    """bitsandbytes stores 4-bit weights packed two per byte, by default in a uint8 tensor. Here a CPU
    stand-in does the same to every decoder-layer Linear of the bf16 tiny model
    (smolfsdp.gotchas.cases_reported.Packed4bitLinear: absmax per row, 16 levels, dequantised in forward).
    FSDP1 flattens every parameter of a unit into one FlatParameter of one floating dtype and refuses the
    uint8 weight, the first parameter of each decoder layer. The fix bitsandbytes offers is
    bnb_4bit_quant_storage: keep the same bytes in a tensor of the other parameters' dtype (bf16). FSDP1
    then shards and gathers them untouched: the gathered bytes are identical and the logits equal the unsharded
    model's. FSDP2 (one DTensor per parameter, all-gathered as bytes when dtypes differ) takes uint8 storage
    as it is. bitsandbytes itself needs a GPU: see the paragraph on QLoRA below the reproduced cases.""",
    thread="https://github.com/huggingface/peft/issues/1432",
)

_entry(
    "kv_cache_checkpointing",
    "Activation checkpointing with the KV cache on: a shape mismatch in backward",
    DIST,
    """SmolLM3's config keeps use_cache=True, so a training forward builds a DynamicCache and every decoder
    layer appends its keys and values to it. Under activation checkpointing the layer's forward runs again in
    backward and appends them a second time: the recomputed attention sees twice the key length, and with a
    padded batch the mask no longer fits (the size mismatch in the outcome row; on GPUs with flash attention,
    torch.utils.checkpoint's "Recomputed values ... have different metadata").
    transformers' own gradient_checkpointing turns the cache off; FSDP's checkpoint wrapper (accelerate's
    fsdp_activation_checkpointing, or a hand-written loop) does not. Fix: config.use_cache=False, as
    smolfsdp.sharding.shards.apply_activation_checkpointing sets; the recomputed step's loss then equals the
    loss without checkpointing.""",
    thread="https://github.com/huggingface/transformers/issues/34928",
)

_entry(
    "state_dict_one_rank",
    "A save that hangs: one rank skips the state-dict gather",
    DIST,
    """A full state dict (get_model_state_dict with full_state_dict=True, FSDP1's FULL_STATE_DICT, or
    accelerate's get_state_dict) all-gathers every sharded parameter: a collective every rank must call, even
    the ranks that do not write the file. Written as `if rank == 0: sd = get_model_state_dict(...)`, rank 0
    waits in the first all-gather for a rank that never comes, for the process group's timeout (the
    'default timeouts' row; NCCL's own default on CUDA builds is shorter); here the group's timeout is cut to
    seconds. gloo's error names
    no collective; smolfsdp.sharding.distributed.name_collective_errors (around every launched run) re-raises
    it as a CollectiveError naming the rank, the collective and its input sizes (the 'package guard' row).
    The rule: every rank calls the gather, rank 0 alone writes (smolfsdp.train.export.save_final_model).""",
    thread="https://github.com/huggingface/transformers/pull/10596",
)

_entry(
    "rank0_works_alone",
    "A collective timeout while rank 0 tokenises alone",
    DIST,
    """TRL's SFTTrainer tokenises inside main_process_first: the other ranks wait at a barrier while rank 0
    maps the data set, and a barrier is a collective bounded by the process group's timeout (the Trainer's
    ddp_timeout; NCCL's watchdog then kills the process). Data sets that take longer than that
    to tokenise kill the run before its first step. Here rank 0 works for a few seconds (a sleep standing in
    for tokenising) against a group timeout of less: the waiting rank times out (rank 0's own barrier then
    finds its peer gone). The fixes: a timeout sized to the work (ddp_timeout, accelerate's
    InitProcessGroupKwargs), tokenising once before training (datasets caches it), or every rank preparing its
    own copy with no barrier, as smolfsdp.data.prepare does.""",
    thread="https://github.com/hiyouga/LlamaFactory/issues/2424",
)

_entry(
    "clip_grad_norm_fsdp1",
    "torch.nn.utils.clip_grad_norm_ on an FSDP1 model",
    DIST,
    """FSDP1's model.parameters() on each rank are views into its own shard of the FlatParameter, so
    torch.nn.utils.clip_grad_norm_ computes each rank's own norm and scales each shard by a different factor:
    the clipped gradient is not the clipped gradient of the model (its norm is not max_norm). Fix:
    FullyShardedDataParallel.clip_grad_norm_, which all-reduces the squared norms first; every rank then
    returns the model's norm. FSDP2 does not need it: its parameters are DTensors, and
    torch.nn.utils.clip_grad_norm_ computes the norm over the whole DTensor (smolfsdp.train.steps uses each).""",
    thread="https://github.com/pytorch/pytorch/issues/72548",
)

_entry(
    "bf16_weights_lose_updates",
    "bf16 weights lose most small updates",
    DIST,
    """A model loaded in bf16 and sharded as it is keeps its only copy of the weights in bf16: 8 significant
    bits, so an update smaller than half the spacing between neighbouring bf16 values near the weight
    rounds back to the same value. AdamW's first step moves each weight by about the learning rate; at a
    fine-tuning rate (the 'learning rate' row), only the weights smallest in magnitude move. Fix: keep fp32 sharded weights and
    compute in bf16 (FSDP1's MixedPrecision(param_dtype=torch.bfloat16), FSDP2's MixedPrecisionPolicy, the
    package's mixed_precision: bf16): the optimizer updates fp32 values and every weight moves.""",
    thread="https://github.com/vllm-project/speculators/pull/765",
)
