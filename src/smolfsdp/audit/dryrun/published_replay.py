"""The dry run and the allocator replay on published GPU runs: tensor peak and *reserved* memory, no GPU.

Appendix "How the estimates are checked" (``notebooks/appendix_checks.ipynb``), section "Held to published
GPU runs"; ``scripts/published_check.py`` writes the
result into ``data/results/published/check.json`` (``dry_run``) and tests/test_published.py holds it. For each
row of :data:`DRY_RUN_ROWS` (``data/results/published/rows.json``):

1. the dry run (``smolfsdp.audit.dryrun.dry_run.dry_run``) of the row's setup (its model's config.json, world size, FSDP
   version, activation checkpointing, micro-batch and sequence), stepping with the row's own loop where the
   published code's loss differs from transformers' (:class:`TorchtitanLoop`), records every allocation and free
   in order, with its stream (``smolfsdp.audit.dryrun.streams.allocator_trace``);
2. ``smolfsdp.audit.allocator_replay.replay`` runs that order through the CUDA caching allocator's policy, with
   AdamW's state made lazily in the first step, over ``allocator.REPLAY_STEPS`` steps;
3. reserved = the replay's peak reserved + ``reserved.CUBLAS_WORKSPACE_BYTES``; active = its peak of bytes
   handed out (FSDP1's ``record_stream``'ed blocks held until the next such free).

Rows whose torch predates pytorch/pytorch#129721 (2024-06-27: FSDP2 moved the reduce-scatter input from the
reduce-scatter stream's pool to the default stream's) say ``"fsdp2_rs_input": "reduce-scatter stream"`` and
are replayed so. Traced and replayed on a CPU, not measured: the error % beside each row is the model's.

    python -c "from smolfsdp.audit.dryrun.published_replay import dry_run_row, rows_by_id; print(dry_run_row(rows_by_id()['torchtitan/pr165-7b-fsdp2-ac']))"
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch.nn.functional as F

from smolfsdp.audit.allocator_replay import REPLAY_STEPS, replay
from smolfsdp.audit.dryrun.dry_run import dry_run
from smolfsdp.audit.published_rows import TOLERANCE_PCT, load_rows
from smolfsdp.config import TrainConfig, load_config
from smolfsdp.errors import ConfigError
from smolfsdp.estimate.reserved import CUBLAS_WORKSPACE_BYTES
from smolfsdp.paths import repo_root

GIB = 2**30
#: At most six rows (issue 31): torchtitan 83c879f1's four (active and reserved, FSDP1 / FSDP2 x full / op-level
#: selective AC, Llama 7B, 8 x 2048 tokens) and the 2024-12 H100 benchmark's two Llama 3.1 8B rows (2 x 8192
#: tokens, op-level selective AC, FSDP2 on 8 and 128 GPUs). Every one a full fine-tune with torchtitan's loop.
DRY_RUN_ROWS = (
    "torchtitan/pr165-7b-fsdp1-ac",
    "torchtitan/pr165-7b-fsdp1-sac",
    "torchtitan/pr165-7b-fsdp2-ac",
    "torchtitan/pr165-7b-fsdp2-sac",
    "torchtitan/h100-8b-fsdp-sac",
    "torchtitan/h100-8b-128gpu-fsdp-sac",
)
#: The recipe a row's overrides start from (its native-engine fields; the row replaces model and shape).
BASE_RECIPE = "configs/runs/smollm3_3b_medical.yaml"


@dataclass
class TorchtitanLoop:
    """torchtitan's micro-batch step: ``pred = model(input_ids)``, logits cast to fp32 (its model returned
    ``self.output(h).float()``), ``F.cross_entropy`` over every position, ``loss.backward()``.

    ``loss_path`` (``smolfsdp.estimate.loss_path``): ``"torchtitan-fp32-held"``: the loop keeps ``pred`` through
    backward (train.py before torchtitan e29b6b4); ``"torchtitan"``: it is dropped first (``del pred``)."""

    loss_path: str

    def __call__(self, model, batch) -> None:
        pred = model(input_ids=batch["input_ids"]).logits.float()
        loss = F.cross_entropy(pred.flatten(0, 1), batch["labels"].flatten(0, 1))
        if self.loss_path != "torchtitan-fp32-held":
            del pred
        loss.backward()


def rows_by_id() -> dict[str, dict]:
    """The published rows by id."""
    return {r["id"]: r for r in load_rows()["rows"]}


def row_config(row: dict) -> TrainConfig:
    """The run config of a published full fine-tune row (native engine, bf16 mixed precision with fp32
    reduction, AdamW). ConfigError for LoRA, offload or a loss the dry run cannot step (not torchtitan's)."""
    if row.get("lora") or row.get("offload"):
        raise ConfigError(f"{row['id']}: the published-row dry run covers full fine-tunes without offload.")
    if not str(row.get("loss_path", "")).startswith("torchtitan"):
        raise ConfigError(
            f"{row['id']}: loss_path {row.get('loss_path')!r} has no loop here; give a torchtitan row."
        )
    return load_config(
        repo_root() / BASE_RECIPE, model=str(repo_root() / row["model"]), engine="native",
        fsdp_version=row["fsdp_version"], sharding_strategy=row["strategy"], mixed_precision="bf16",
        activation_checkpointing=row.get("activation_checkpointing", False), ac_mode=row.get("ac_mode", "full"),
        ac_every=row.get("ac_every"), max_length=row["seq_len"], per_device_train_batch_size=row["micro_batch"],
        gradient_accumulation_steps=1, nproc=row["world_size"], lora=False,
    )  # fmt: skip


def dry_run_row(row: dict, progress=None) -> dict:
    """The dry run and the allocator replay of one published row, beside its published numbers (GiB, error %
    = (ours - published) / published, within the issue's tolerance: reserved 10 %, active 5 %)."""
    t0 = time.perf_counter()
    cfg = row_config(row)
    report = dry_run(
        cfg, world_size=row["world_size"], progress=progress, loop=TorchtitanLoop(row["loss_path"])
    )
    rs_stream = row.get("fsdp2_rs_input") == "reduce-scatter stream"
    out = replay(report.alloc_events, steps=REPLAY_STEPS, rs_input_on_rs_stream=rs_stream)
    ours = {
        "reserved": (out["peak_reserved"] + CUBLAS_WORKSPACE_BYTES) / GIB,
        "active": out["peak_active"] / GIB,
        "allocated": out["peak_allocated"] / GIB,
    }
    rec = {
        "id": row["id"],
        "dry_run_peak_gib": round(report.peak_bytes / GIB, 3),
        "replay": {"steps": REPLAY_STEPS, "lazy_optimizer_state": True, "streams": True, "record_stream": True,
                   "rs_input_on_rs_stream": rs_stream, "segments": out["segments"],
                   "reserved_by_step_gib": [round(b / GIB, 3) for b in out["reserved_by_step"]]},
        "loss_path": row["loss_path"],
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    for key, published in row["measured"].items():
        what = key[: -len("_gib")] if key.endswith("_gib") else None
        if what in ours:
            err = 100 * (ours[what] - published) / published
            rec[what] = {"published_gib": published, "ours_gib": round(ours[what], 3), "error_pct": round(err, 2),
                         "within_tolerance": abs(err) <= TOLERANCE_PCT[what]}  # fmt: skip
    return rec


def dry_run_rows(ids=DRY_RUN_ROWS, progress=None) -> list[dict]:
    """:func:`dry_run_row` for each id (ConfigError for an id not in rows.json)."""
    rows = rows_by_id()
    missing = [i for i in ids if i not in rows]
    if missing:
        raise ConfigError(f"not in data/results/published/rows.json: {missing}")
    return [dry_run_row(rows[i], progress=progress) for i in ids]
