"""The gotchas that run in one process, or in a launch of their own because the failing form crashes it.

Chapter "Debugging the seams" (``notebooks/06_gotchas.ipynb``) through ``smolfsdp.gotchas.run_all``; each
case registers itself in ``smolfsdp.gotchas.registry.GOTCHAS``.

    smolfsdp gotchas --run checkpoint_disk_full,tracker_wrong_project
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import Trainer, TrainingArguments
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from smolfsdp.checkpoint.dcp import check_disk_space, estimate_checkpoint_bytes
from smolfsdp.config import TrainConfig
from smolfsdp.data.prepare import prepare_data
from smolfsdp.gotchas.builders import decoder_layer_cls, rank_batch, tiny_model
from smolfsdp.gotchas.registry import (
    WRONG,
    attempt,
    gotcha,
)
from smolfsdp.sharding.fsdp1 import wrap_fsdp1


@gotcha("checkpoint_disk_full")
def checkpoint_diskfull_tensor(out: Path) -> dict[str, Any]:

    model = tiny_model()[0]
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
        model(**rank_batch(0)).loss.backward()
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


@gotcha("tracker_wrong_project")
def tracker_wrong_project(out: Path) -> dict[str, Any]:
    results = {}
    for form in ("failing", "fixed"):
        env = {**os.environ, "TRACKIO_DIR": str(out / f"trackio_{form}"), "HF_HUB_OFFLINE": "1"}
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU Trainer run on purpose, also on a GPU box
        cmd = [sys.executable, "-m", "smolfsdp.gotchas.run_all", "--trackio-form", form, "--out", str(out)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"trackio {form} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        results[form] = json.loads((out / f"trackio_{form}.json").read_text())
    return results


def trackio_form(form: str, out: Path) -> None:
    """One Trainer run reporting to trackio (TRACKIO_DIR set by the caller); writes what the store holds."""
    import trackio  # deferred: trackio reads TRACKIO_DIR when imported; this subprocess's caller set it
    from trackio.sqlite_storage import SQLiteStorage  # deferred with trackio

    model, tok = tiny_model()
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
        model=model,
        args=args,
        train_dataset=data.train,
        data_collator=DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id),
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


@gotcha("fsdp1_cpu_offload_state_dict")
def fsdp1_cpu_offload_state_dict(rank: int, world: int, offload: bool) -> dict[str, Any]:

    model = wrap_fsdp1(tiny_model()[0], decoder_layer_cls())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    return {"outcome": "ok", "keys_on_rank": len(state)}
