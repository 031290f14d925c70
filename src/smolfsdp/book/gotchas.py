"""The seams where FSDP, the Trainer and their neighbours fail, each reproduced and then fixed.

Used by the chapter "Debugging the seams". Every gotcha runs a failing setup and a fixed setup and
returns what happened in each: the exception (type and first line of its message) or the measured
symptom. Distributed gotchas run on 2 gloo ranks in one ``torchrun`` subprocess (never a process
group in the caller); the others run in a plain subprocess.

    smolfsdp gotchas --list
    smolfsdp gotchas --run optimizer_before_sharding [--json]
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m smolfsdp.book.gotchas \\
        --ranks tied_embeddings --out runs/gotchas
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smolfsdp.config import ConfigError

DIST, LOCAL, CRASH = "dist", "local", "crash"  # how a gotcha runs: 2 ranks, 1 process, own launch
WRONG = "wrong result"  # outcome of a form that raised nothing but measurably did the wrong thing


@dataclass
class Gotcha:
    name: str
    title: str
    kind: str
    explanation: str
    fn: Any = field(repr=False, default=None)


@dataclass
class GotchaResult:
    name: str
    title: str
    failing: dict[str, Any]
    fixed: dict[str, Any]
    explanation: str
    versions: dict[str, str]


GOTCHAS: dict[str, Gotcha] = {}


def gotcha(name: str, title: str, kind: str, explanation: str):
    def register(fn):
        GOTCHAS[name] = Gotcha(name, title, kind, " ".join(explanation.split()), fn)
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


def check_wrapping(model: nn.Module, wrap_cls: type[nn.Module] | str) -> int:
    """Number of FSDP units (FSDP1 or FSDP2) in ``model``; raise when the policy wrapped no layer.

    Raises ConfigError when the model has decoder layers (``wrap_cls`` instances) but only the
    root is an FSDP unit: then every step all-gathers the whole model at once and nothing is sharded
    per layer, which no error reveals.
    """
    from smolfsdp.sharding import fsdp1, fsdp2

    name = wrap_cls if isinstance(wrap_cls, str) else wrap_cls.__name__
    layers = [m for m in model.modules() if type(m).__name__ in (name, "FSDP" + name)]
    units = len(fsdp1.fsdp_units(model)) + len(fsdp2.fsdp_units(model))
    if layers and units <= 1:
        raise ConfigError(
            f"the wrap policy wrapped none of the {len(layers)} {name} modules: the model has {units} FSDP "
            f"unit (the root). Wrap the class the model really uses (check type(layer).__name__)."
        )
    return units


# ---------------------------------------------------------------------------------- helpers
def _tiny(seed: int = 0, **kw):
    from smolfsdp.models.modeling import build_model, load_tokenizer

    tok = load_tokenizer("tiny")
    return build_model("tiny", tok, seed=seed, **kw), tok


def _batch(rank: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 500, (2, 24), generator=torch.Generator().manual_seed(100 + rank))
    return {"input_ids": ids, "labels": ids.clone()}


def _layer_cls():
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3DecoderLayer

    return SmolLM3DecoderLayer


def _fsdp2(model: nn.Module, world: int) -> nn.Module:
    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh

    return apply_fsdp2(model, build_mesh("cpu", world), _layer_cls())


def _full(p) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


# ------------------------------------------------------------------------- the gotchas (2 ranks)
@gotcha(
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
def fsdp2_mixed_dtensor(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from smolfsdp.sharding.fsdp1 import wrap_fsdp1

    ids = _batch(rank)["input_ids"]
    model = _fsdp2(_tiny()[0], world)
    failing = attempt(lambda: {"shape": list(model.model(input_ids=ids).last_hidden_state.shape)})
    model = _fsdp2(_tiny()[0], world)  # the failed call left the first layer's FSDP state initialised

    def unshard_call():
        model.unshard()
        hidden = model.model(input_ids=ids).last_hidden_state
        model.reshard()
        types = sorted({type(p).__name__ for p in model.parameters()})
        return {"shape": list(hidden.shape), "parameter_types_after": types}

    fixed = attempt(unshard_call)
    m1 = wrap_fsdp1(_tiny()[0], _layer_cls())
    seed_fix = attempt(lambda: {"shape": list(m1.module.model(input_ids=ids).last_hidden_state.shape)})

    def summon():
        with FSDP.summon_full_params(m1, recurse=False):
            return {"shape": list(m1.module.model(input_ids=ids).last_hidden_state.shape)}

    return {"failing": failing, "fixed": {**fixed, "fsdp1_pinned": seed_fix, "fsdp1_summon": attempt(summon)}}


@gotcha(
    "wrap_class",
    "A wrap class the model does not have, and a policy that wraps nothing",
    DIST,
    """A misspelt wrap class is caught by smolfsdp.models.modeling.resolve_wrap_class, which names the
    closest class. The quiet failure is a policy whose class is real but not in this model (here
    LlamaDecoderLayer): FSDP1's transformer_auto_wrap_policy matches nothing, the root becomes the
    only unit, the model is one FlatParameter gathered at once, and no error is raised.
    smolfsdp.book.gotchas.check_wrapping counts the units and refuses that.""",
)
def wrap_class(rank: int, world: int) -> dict[str, Any]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from smolfsdp.models.modeling import resolve_wrap_class
    from smolfsdp.sharding.fsdp1 import fsdp_units, wrap_fsdp1

    model = _tiny()[0]
    misspelt = attempt(lambda: {"class": resolve_wrap_class(model, "SmolLM3DecoderLayers").__name__})
    wrong = wrap_fsdp1(_tiny()[0], LlamaDecoderLayer)
    units = len(fsdp_units(wrong))
    quiet = {"outcome": "measured", "fsdp_units": units, "decoder_layers": 4}
    if units <= 1:  # nothing raised: say what went wrong instead of "measured"
        quiet.update(
            outcome=WRONG, symptom=f"no decoder layer wrapped: {units} FSDP unit (the root) for 4 layers"
        )
    failing = {
        **quiet,
        "check_wrapping": attempt(lambda: {"units": check_wrapping(wrong, "SmolLM3DecoderLayer")}),
    }
    right = wrap_fsdp1(_tiny()[0], resolve_wrap_class(model))
    fixed = attempt(lambda: {"fsdp_units": check_wrapping(right, "SmolLM3DecoderLayer")})
    return {"failing": {**failing, "misspelt": misspelt}, "fixed": fixed}


@gotcha(
    "trainer_fsdp_is_ddp",
    "The Trainer's FSDP silently runs as DDP on CPU",
    DIST,
    """TrainingArguments(fsdp=..., use_cpu=True) on 2 processes trains without a word, but
    accelerate 1.15 keeps an FSDP plugin only for accelerator devices: the model is wrapped in
    DistributedDataParallel and every rank holds all parameters. smolfsdp.train.trl_engine.detect_effective reads
    what the Trainer really built. The fix: smolfsdp.train.accelerate_cpu_fsdp lifts exactly that gate (and
    gives FSDP a plain cpu device), and the same Trainer then wraps FullyShardedDataParallel units.""",
)
def trainer_fsdp_is_ddp(rank: int, world: int) -> dict[str, Any]:
    from accelerate.state import AcceleratorState

    from smolfsdp.config import TrainConfig
    from smolfsdp.measure.results import RunWriter
    from smolfsdp.sharding.distributed import DistInfo
    from smolfsdp.train.trl_engine import run_trl

    info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")
    out = Path(os.environ.get("SMOLFSDP_GOTCHA_OUT", tempfile.mkdtemp()))
    results = {}
    for label, lifted in (("failing", False), ("fixed", True)):
        cfg = TrainConfig(
            name=f"gotcha-trl-{label}",
            output_dir=str(out),
            engine="trl",
            max_steps=1,
            eval_steps=0,
            save_final_model=False,
            max_rows=32,
            accelerate_fsdp_on_cpu=lifted,
        )
        AcceleratorState._reset_state()  # each Trainer builds its accelerator state afresh (same group)
        writer = RunWriter(cfg.run_dir, enabled=rank == 0)
        try:
            fields = run_trl(cfg, info, writer)
        finally:
            writer.close()
        eff = fields["effective"]
        results[label] = {
            "outcome": "measured",
            "requested": fields["requested"]["strategy"],
            **_effective(eff),
            "fsdp_units": eff["evidence"].get("fsdp_units", 0),
            "parameter_type": eff["evidence"].get("parameter_type", "torch.nn.Parameter (full copy)"),
            "held_per_rank": fields["params"]["fraction_per_rank"][rank],
        }
        if results[label]["strategy"] != results[label]["requested"]:  # trained, silently not as asked
            results[label].update(
                outcome=WRONG, symptom=f"asked for {results[label]['requested']}, ran {eff['strategy']}"
            )
    return results


def _effective(eff: dict[str, Any]) -> dict[str, Any]:
    return {"strategy": eff["strategy"], "wrapper": eff["evidence"]["wrapper"], "reason": eff["reason"]}


@gotcha(
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
def gradient_checkpointing(rank: int, world: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from smolfsdp.book.mechanics import collective_kind
    from smolfsdp.sharding.fsdp1 import wrap_fsdp1
    from smolfsdp.train.native import _apply_activation_checkpointing

    batch, rows = _batch(rank), {}
    for version in (1, 2):
        for mode in ("none", "fsdp_ac", "hf_use_reentrant_false", "hf_use_reentrant_true"):
            model = _tiny()[0]
            if mode == "fsdp_ac":
                _apply_activation_checkpointing(model, _layer_cls())
            elif mode.startswith("hf"):
                kw = {"use_reentrant": mode.endswith("true")}
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            model = wrap_fsdp1(model, _layer_cls()) if version == 1 else _fsdp2(model, world)
            model(**batch).loss.backward()  # lazy init outside the profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(**batch).loss.backward()
            # aten::silu runs once per decoder-layer MLP forward: 4 per step, 8 when layers are recomputed
            counts = {"all-gather": 0, "reduce-scatter": 0, "layer_forwards": 0}
            for e in prof.events():
                kind = "layer_forwards" if e.name == "aten::silu" else collective_kind(e.name)
                if kind in counts:
                    counts[kind] += 1
            rows[f"fsdp{version}/{mode}"] = counts
    failing = {k: v for k, v in rows.items() if "/hf_" in k}
    fixed = {k: v for k, v in rows.items() if "/hf_" not in k}
    return {"failing": {"outcome": "measured", **failing}, "fixed": {"outcome": "measured", **fixed}}


@gotcha(
    "tied_embeddings",
    "Tied embeddings placed in separate FSDP2 groups",
    DIST,
    """SmolLM3 ties lm_head.weight to embed_tokens.weight (one Parameter). fully_shard(model.lm_head)
    on its own puts that Parameter in a second group; with torch 2.13 the root's fully_shard then
    refuses loudly (we have not measured what older releases did). Keep both in the
    root group, as smolfsdp.sharding.fsdp2.apply_fsdp2 does: after a step they are still one tensor.""",
)
def tied_embeddings(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    from smolfsdp.sharding.fsdp2 import build_mesh

    def step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(**_batch(rank)).loss.backward()
        opt.step()
        head, emb = model.lm_head.weight, model.model.embed_tokens.weight
        return {"same_parameter": head is emb, "max_abs_diff": float((_full(head) - _full(emb)).abs().max())}

    def separate():
        model, mesh = _tiny()[0], build_mesh("cpu", world)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model.lm_head, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return step(model)

    return {"failing": attempt(separate), "fixed": attempt(lambda: step(_fsdp2(_tiny()[0], world)))}


@gotcha(
    "optimizer_before_sharding",
    "The optimizer created before sharding",
    DIST,
    """fully_shard replaces every parameter with a new DTensor Parameter. An optimizer built before
    holds the old tensors, which never receive a gradient: step() runs, the loss is computed, and
    no weight changes. Build the optimizer from model.parameters() after sharding.""",
)
def optimizer_before_sharding(rank: int, world: int) -> dict[str, Any]:
    def run(before: bool):
        model = _tiny()[0]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2) if before else None
        _fsdp2(model, world)
        opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-2)
        start = {n: _full(p).clone() for n, p in model.named_parameters()}
        loss = float(model(**_batch(rank)).loss.detach())
        model(**_batch(rank)).loss.backward()
        opt.step()
        change = max(float((_full(p) - start[n]).abs().max()) for n, p in model.named_parameters())
        with_grad = sum(p.grad is not None for g in opt.param_groups for p in g["params"])
        return {"max_param_change": change, "optimizer_params_with_grad": with_grad, "loss": round(loss, 4)}

    failing = attempt(run, True)
    if failing["outcome"] == "ok" and failing["max_param_change"] == 0.0:
        # no exception is the whole trap: attempt() says "ok", so name the measured symptom instead
        failing.update(outcome=WRONG, symptom="optimizer.step() ran and no weight changed")
    return {"failing": failing, "fixed": attempt(run, False)}


@gotcha(
    "peft_fp32_adapters_fsdp1",
    "peft's fp32 adapters on a bf16 base and FSDP1's one-dtype FlatParameter",
    DIST,
    """peft (autocast_adapter_dtype=True, its default) keeps LoRA weights in fp32 on a bf16 base.
    FSDP1 flattens every unit's parameters into one FlatParameter, which needs one dtype, so
    wrapping fails. Fixes: keep adapters in the base dtype (autocast_adapter_dtype=False), load the
    base in fp32 with MixedPrecision for compute, or use FSDP2 (per-parameter DTensors).""",
)
def peft_fp32_adapters_fsdp1(rank: int, world: int) -> dict[str, Any]:
    from peft import LoraConfig, get_peft_model

    from smolfsdp.sharding.fsdp1 import fsdp_units, wrap_fsdp1

    def wrap(autocast: bool):
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = get_peft_model(_tiny(dtype=torch.bfloat16)[0], lora, autocast_adapter_dtype=autocast)
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
        return {"dtypes": dtypes, "fsdp_units": len(fsdp_units(wrap_fsdp1(model, _layer_cls())))}

    return {"failing": attempt(wrap, True), "fixed": attempt(wrap, False)}


# ----------------------------------------------------------------------- one process / own launch
@gotcha(
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
def checkpoint_disk_full(out: Path) -> dict[str, Any]:
    from smolfsdp.checkpoint.dcp import check_disk_space, estimate_checkpoint_bytes

    model = _tiny()[0]
    needed = estimate_checkpoint_bytes(model)
    disk = out / "small_disk"
    disk.mkdir(parents=True, exist_ok=True)
    size = needed // 2
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True
    )
    if mount.returncode != 0:
        skip = {
            "outcome": "skipped",
            "message": f"could not mount a small tmpfs: {mount.stderr.decode().strip()}",
        }
        return {"failing": skip, "fixed": skip}
    try:
        size = shutil.disk_usage(disk).total  # tmpfs rounds the size up to whole pages
        fixed = attempt(check_disk_space, disk / "run", needed)  # before training, on the empty disk
        opt = torch.optim.AdamW(model.parameters())
        model(**_batch(0)).loss.backward()
        opt.step()

        def save():
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, disk / "step-1" / "state.pt")

        (disk / "step-1").mkdir()
        failing = attempt(save)
        left = sorted(p.name for p in (disk / "step-1").iterdir())
        failing.update(
            left_behind=left, left_bytes=sum(p.stat().st_size for p in (disk / "step-1").iterdir())
        )
        failing.update(needed_bytes=needed, filesystem_bytes=size)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    return {
        "failing": failing,
        "fixed": {**fixed, "refused_before_training": fixed.get("error") == "DiskSpaceError"},
    }


@gotcha(
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
def tracker_wrong_project(out: Path) -> dict[str, Any]:
    script = Path(__file__).resolve()
    results = {}
    for form in ("failing", "fixed"):
        env = {**os.environ, "TRACKIO_DIR": str(out / f"trackio_{form}"), "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, str(script), "--trackio-form", form, "--out", str(out)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"trackio {form} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        results[form] = json.loads((out / f"trackio_{form}.json").read_text())
    return results


def _trackio_form(form: str, out: Path) -> None:
    """One Trainer run reporting to trackio (TRACKIO_DIR set by the caller); writes what the store holds."""
    import trackio
    from trackio.sqlite_storage import SQLiteStorage
    from transformers import Trainer, TrainingArguments

    from smolfsdp.config import TrainConfig
    from smolfsdp.data.prepare import prepare_data
    from smolfsdp.train.batches import PadCollator

    model, tok = _tiny()
    data = prepare_data(TrainConfig(max_rows=16, eval_size=0), tok)
    project = "smolfsdp-medical"
    if form == "failing":
        trackio.init(project=project, name="by-hand")
        trackio.log({"note": 1.0})
    args = TrainingArguments(
        output_dir=str(out / f"trainer_{form}"),
        max_steps=2,
        logging_steps=1,
        report_to="trackio",
        project="huggingface" if form == "failing" else project,
        run_name="trainer",
        use_cpu=True,
        per_device_train_batch_size=2,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    Trainer(
        model=model, args=args, train_dataset=data.train, data_collator=PadCollator(tok.pad_token_id)
    ).train()
    finish = attempt(trackio.finish) if form == "failing" else {"outcome": "ok"}
    found = {}
    for proj in SQLiteStorage.get_projects():
        for run in SQLiteStorage.get_runs(proj):
            logs = SQLiteStorage.get_logs(proj, run)
            found[f"{proj}/{run}"] = sum("train/loss" in row for row in logs)
    losses = {k: v for k, v in found.items() if v}
    result = {"outcome": "measured", "train_loss_rows": found, "expected_project": project}
    result.update(loss_in_expected_project=any(k.startswith(project + "/") for k in losses))
    result.update(runs_with_loss=len(losses), final_finish=finish)
    if not result["loss_in_expected_project"]:  # the Trainer ran fine; its metrics went elsewhere
        result.update(outcome=WRONG, symptom=f"train/loss went to {', '.join(sorted(losses))}, not {project}")
    (out / f"trackio_{form}.json").write_text(json.dumps(result))


@gotcha(
    "fsdp1_cpu_offload_state_dict",
    "FSDP1 full state dict with cpu_offload=True on a CPU-only gloo run",
    CRASH,
    """get_model_state_dict(model, StateDictOptions(full_state_dict=True, cpu_offload=True)) on
    FSDP1 with gloo and no GPU kills rank 0 with SIGSEGV (exit code -11) in torch 2.13: a real
    crash, not an exception, so it is run in its own launch. On CPU the gathered tensors are in host
    memory already: pass cpu_offload only when the device is CUDA (smolfsdp.train.export.save_final_model).""",
)
def fsdp1_cpu_offload_state_dict(rank: int, world: int, offload: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from smolfsdp.sharding.fsdp1 import wrap_fsdp1

    model = wrap_fsdp1(_tiny()[0], _layer_cls())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    return {"outcome": "ok", "keys_on_rank": len(state)}


# ------------------------------------------------------------------------------ running them
def _launch(names: list[str], out: Path, nproc: int, extra: list[str] = ()) -> subprocess.CompletedProcess:
    from smolfsdp.launch.torchrun import launch_env, torchrun_command

    args = ["--ranks", ",".join(names), "--out", str(out), *extra]
    cmd = torchrun_command(nproc, args, module="smolfsdp.book.gotchas")
    env = {**launch_env(nproc), "SMOLFSDP_GOTCHA_OUT": str(out)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def _crash_form(out: Path, offload: bool) -> dict[str, Any]:
    name = "fsdp1_cpu_offload_state_dict"
    proc = _launch(
        [name], out / ("offload" if offload else "no_offload"), 2, ["--offload"] if offload else []
    )
    found = re.findall(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", proc.stdout + proc.stderr, re.S)
    res = {"outcome": "ok" if proc.returncode == 0 else "crash", "torchrun_returncode": proc.returncode}
    if found:  # torchrun's failure summary: the first failure (root cause) is listed last
        res["rank_exit_codes"] = {f"rank{r}": int(c) for r, c in found}
    if proc.returncode == 0:
        res.update(
            json.loads((out / ("no_offload" if not offload else "offload") / f"{name}.json").read_text())
        )
    return res


def run_gotchas(names: list[str] | None = None, out: str | Path | None = None) -> dict[str, GotchaResult]:
    """Run gotchas (all by default) in subprocesses; return their results by name, in registry order."""
    from smolfsdp.measure.results import versions

    names = list(GOTCHAS) if names is None else names
    unknown = [n for n in names if n not in GOTCHAS]
    if unknown:
        raise ConfigError(f"unknown gotcha(s) {unknown}; known: {list(GOTCHAS)}")
    out = Path(out or tempfile.mkdtemp(prefix="smolfsdp-gotchas-"))
    out.mkdir(parents=True, exist_ok=True)
    raw: dict[str, dict[str, Any]] = {}
    dist_names = [n for n in names if GOTCHAS[n].kind == DIST]
    if dist_names:
        proc = _launch(dist_names, out, 2)
        if proc.returncode != 0:
            raise RuntimeError(f"gotchas {dist_names} failed:\n{(proc.stdout + proc.stderr)[-6000:]}")
        raw.update({n: json.loads((out / f"{n}.json").read_text()) for n in dist_names})
    for n in names:
        g = GOTCHAS[n]
        if g.kind == LOCAL:
            raw[n] = g.fn(out / n)
        elif g.kind == CRASH:
            raw[n] = {"failing": _crash_form(out / n, True), "fixed": _crash_form(out / n, False)}
    vers = versions()
    return {
        n: GotchaResult(n, GOTCHAS[n].title, raw[n]["failing"], raw[n]["fixed"], GOTCHAS[n].explanation, vers)
        for n in names
    }


def summary_frame(results: dict[str, GotchaResult]):
    """One row per gotcha: what the failing and the fixed form did (exception type or outcome)."""
    import pandas as pd

    def said(d):
        return d.get("error") or d["outcome"]

    rows = [{"gotcha": r.name, "failing": said(r.failing), "fixed": said(r.fixed)} for r in results.values()]
    return pd.DataFrame(rows)


def format_result(r: GotchaResult, width: int = 60) -> str:
    """The failing and fixed forms side by side, then the explanation (plain text for the chapter)."""
    import textwrap

    def lines(d):
        return [ln for k, v in d.items() for ln in textwrap.wrap(f"{k}: {v}", width - 2) or [""]]

    left, right = lines(r.failing), lines(r.fixed)
    rows = [f"{'FAILING':<{width}}| FIXED", "-" * width + "+" + "-" * width]
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        rows.append(f"{a:<{width}}| {b}")
    return f"== {r.title} ({r.name})\n" + "\n".join(rows) + "\n\n" + textwrap.fill(r.explanation, 2 * width)


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


def _main_ranks(names: list[str], out: Path, offload: bool) -> None:
    from smolfsdp.sharding.distributed import init_distributed, teardown

    info = init_distributed()
    for name in names:
        g = GOTCHAS[name]
        args = (offload,) if g.kind == CRASH else ()
        result = g.fn(info.rank, info.world_size, *args)
        torch.distributed.barrier()
        if info.rank == 0:
            (out / f"{name}.json").write_text(json.dumps(result, default=str))
    teardown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="smolfsdp gotchas", description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="list the gotchas")
    p.add_argument("--run", default=None, help="a gotcha name, several joined by commas, or 'all'")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--out", default=None, help="folder for the results and the runs' files")
    p.add_argument("--offload", action="store_true", help=argparse.SUPPRESS)
    # torchrun reads "--run" as its own "--run-path", so launched ranks get the names as --ranks
    p.add_argument("--ranks", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trackio-form", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.trackio_form:
        _trackio_form(args.trackio_form, Path(args.out))
        return 0
    if args.ranks:  # inside torchrun: be one of the 2 ranks
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        _main_ranks(args.ranks.split(","), out, args.offload)
        return 0
    names = None if args.run in (None, "all") else args.run.split(",")
    if args.list or args.run is None:
        print(format_list(as_json=args.json))
        return 0
    results = run_gotchas(names, args.out)
    if args.json:
        print(json.dumps({n: asdict(r) for n, r in results.items()}, indent=2, default=str))
    else:
        print("\n\n".join(format_result(r) for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
