"""``smolfsdp convert``: a DCP checkpoint -> one plain model folder, and what it trusts and where it writes.

:func:`plan_convert` checks everything that reads no tensor (the path, the marker, the output folder, the
model to rebuild); :func:`convert_checkpoint` then verifies every byte, rebuilds the model, loads the shards
in one process and writes ``model.safetensors`` + config + tokenizer. A checkpoint handed in is data, never
code:

A checkpoint's ``config.yaml`` (and its ``COMPLETE`` marker, whose digests whoever edits the folder can
recompute) says which model it was trained from. ``convert`` reads that as a name, never as permission:

* **The model** is rebuilt from ``--model`` when given; otherwise from the saved name only when it is a
  preset (``tiny``, SmolLM3-3B's hub id) or a local folder outside the checkpoint (:func:`convert_model`).
  ``trust_remote_code`` comes only from the command line (default off); the saved value is ignored.
* **The output** never carries code: ``.py`` files left by ``save_pretrained`` are removed before the
  folder is moved into place (:func:`drop_code_files`).
* **Where it writes** (:func:`check_convert_out`): never into a checkpoint, a run's ``checkpoints/`` folder,
  or a folder that holds the checkpoint; ``--overwrite`` replaces only a folder an earlier ``convert``
  wrote (its :data:`CONVERT_MARKER` lists every file), the rule ``train --overwrite`` keeps for run folders
  (``smolfsdp.measure.results.check_run_dir``: nothing a run did not write is deleted).

    smolfsdp convert runs/<name>/checkpoints/step-000006 /tmp/exported [--model tiny] [--overwrite]
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from smolfsdp.checkpoint.verify import (
    MARKER,
    complete_checkpoints,
    dcp_load,
    find_problem,
    is_complete,
    read_dcp_metadata,
    read_marker,
    verify_checkpoint,
)
from smolfsdp.config import load_config
from smolfsdp.errors import ConfigError
from smolfsdp.models.modeling import (
    PRESETS,
    SMOLLM3_3B,
    build_meta_model,
    build_model,
    check_safetensors_folder,
    load_tokenizer,
    refuse_remote_code,
)
from smolfsdp.paths import check_writable_folder, pid_alive, umask_modes
from smolfsdp.sharding.lora import apply_lora

#: The file ``convert`` writes last into its output: where the weights came from and every file it wrote.
CONVERT_MARKER = "smolfsdp_convert.json"
#: Model names a checkpoint may name and ``convert`` rebuilds without being told (no code of theirs runs).
TRUSTED_NAMES = (*PRESETS, SMOLLM3_3B)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def good_checkpoints_sentence(folder: Path) -> str:
    """' Complete checkpoints there that verify (sizes): A, B.' for a run's ``checkpoints/`` folder, or
    ' It holds no complete checkpoint.'; empty when ``folder`` is not a folder. Sizes only (no hashing):
    the listing is cheap, the chosen one is hashed when converted."""
    if not folder.is_dir():
        return ""
    good = []
    for path in complete_checkpoints(folder):
        try:
            if find_problem(path, hashes=False) is None:
                good.append(str(path))
        except ConfigError:  # an unsafe one is not offered
            continue
    if not good:
        return f" {folder} holds no complete checkpoint that verifies."
    return f" Complete checkpoints in {folder} that verify (file sizes): {', '.join(good)}."


def checkpoints_near(ckpt: Path) -> str:
    """The listing of :func:`good_checkpoints_sentence` for what the user probably meant: ``ckpt``'s own
    folder (``runs/<name>/checkpoints``), or ``ckpt/checkpoints`` when ``ckpt`` is a run folder."""
    for folder in (ckpt / "checkpoints", ckpt.parent):
        if folder.is_dir() and (folder.name == "checkpoints" or any(folder.glob("step-*"))):
            return good_checkpoints_sentence(folder)
    return ""


def convert_model(saved: str, config: Path, ckpt: Path, model: str | None, what: str = "model") -> str:
    """The model (``what="tokenizer"``: the tokenizer) ``convert`` rebuilds: ``model`` (the command line's
    ``--model``) when given, else the name saved in ``config`` if it is one of :data:`TRUSTED_NAMES` or a
    local folder outside the checkpoint.

    Raises:
        ConfigError: the saved name is anything else (a hub id, a folder inside the checkpoint, a missing
            path): the command line must say which model to trust.
    """
    if model is not None:
        return model
    if saved in TRUSTED_NAMES:
        return saved
    local = Path(saved).expanduser()
    if local.is_dir() and not _inside(local.resolve(), ckpt.resolve()):
        return saved
    where = "a folder inside the checkpoint" if local.exists() else "not a preset nor a local folder"
    fix = (
        "Pass --model NAME (the model the run trained), and --trust_remote_code only if you trust that model's code."
        if what == "model"
        else "Copy that tokenizer outside the checkpoint and set tokenizer: to it in the run's config.yaml."
    )
    raise ConfigError(
        f"{config} names the {what} {saved!r} ({where}); a checkpoint handed in is data, so convert loads only a "
        f"preset {list(TRUSTED_NAMES)} or a local folder outside it on its word. {fix}"
    )


def _is_run_checkpoints(folder: Path) -> bool:
    return folder.name == "checkpoints" and (
        (folder.parent / "config.yaml").is_file() or any(folder.glob("step-*"))
    )


def check_convert_out(ckpt: Path, out: Path, overwrite: bool) -> None:
    """Refuse an output folder ``convert`` must not write or replace (see the module docstring).

    Raises:
        ConfigError: ``out`` is, holds or is inside the checkpoint, a checkpoint or a run's ``checkpoints/``; it is
            a file; its folder cannot be written; it is not empty and ``overwrite`` is off; or ``overwrite`` is on
            and it holds files an earlier ``convert`` did not write (nothing is deleted).
    """
    out_r, ck_r = out.resolve(), ckpt.resolve()
    if _inside(out_r, ck_r) or _inside(ck_r, out_r):
        what = "is" if out_r == ck_r else ("is inside" if _inside(out_r, ck_r) else "holds")
        raise ConfigError(
            f"OUT {out} {what} the checkpoint {ckpt}: convert never writes into a checkpoint nor replaces the "
            "folder that holds it. Choose an output folder outside the run's checkpoints/, e.g. /tmp/exported."
        )
    for folder in (out_r, *out_r.parents):
        if is_complete(folder) or (folder / ".metadata").is_file() or _is_run_checkpoints(folder):
            raise ConfigError(
                f"OUT {out} is inside {folder}, a checkpoint or a run's checkpoints/ folder (keep-last-K and "
                "resume manage it). Choose an output folder outside it, e.g. /tmp/exported."
            )
    if out.is_symlink():  # the finished folder is renamed onto OUT: a link would be replaced, not followed
        raise ConfigError(
            f"OUT {out} is a symbolic link (to {out_r}); convert replaces the folder OUT itself, not what a "
            f"link points to. Give the real folder instead: {out_r}"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUT {out} is a file; give convert a new or empty folder.")
    check_writable_folder(out.parent, f"OUT {out}")  # the output is made beside OUT, then moved onto it
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ConfigError(
            f"OUT {out} exists and is not empty; choose a new folder, or pass --overwrite to replace the output "
            "of an earlier smolfsdp convert there."
        )
    written = _convert_files(out)
    foreign = sorted(p.name for p in out.iterdir() if written is None or p.name not in written)
    if foreign:
        raise ConfigError(
            f"OUT {out} holds files smolfsdp convert did not write ({', '.join(foreign[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}); --overwrite replaces only an earlier convert's output "
            f"(listed in its {CONVERT_MARKER}). Nothing was deleted; choose a new or empty folder."
        )


def remove_stale_tmps(out: Path) -> list[Path]:
    """Remove the hidden ``.OUT.<pid>.<random>.tmp`` folders beside ``out`` that an earlier convert made
    (owned by this user) whose process ``<pid>`` is gone (a SIGKILL skips the cleanup); returns them."""
    removed = []
    for tmp in sorted(out.parent.glob(f".{glob.escape(out.name)}.*.tmp")):
        pid = tmp.name[len(out.name) + 2 :].split(".", 1)[0]
        ours = pid.isdigit() and tmp.is_dir() and not tmp.is_symlink() and tmp.stat().st_uid == os.getuid()
        if ours and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def _convert_files(out: Path) -> set[str] | None:
    """The top-level names an earlier convert recorded in ``out``'s marker (itself included); None without one."""
    try:
        body = json.loads((out / CONVERT_MARKER).read_text())
        return {str(n).split("/")[0] for n in body["files"]} | {CONVERT_MARKER}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def drop_code_files(folder: Path) -> list[str]:
    """Remove every ``.py`` file under ``folder`` (``convert``'s own temporary output); return their names.
    Custom modelling code that ``save_pretrained`` copies would otherwise travel with the weights."""
    dropped = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py"))
    for name in dropped:
        (folder / name).unlink()
    return dropped


def write_convert_marker(folder: Path, ckpt: Path, model: str) -> None:
    """:data:`CONVERT_MARKER`: the checkpoint and model the weights came from, and every file written."""
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    body = {"checkpoint": str(ckpt), "model": model, "files": files}
    (folder / CONVERT_MARKER).write_text(json.dumps(body, indent=1) + "\n")


def check_matches_model(ckpt: str | Path, model, model_name: str = "the model") -> None:
    """Raise ConfigError naming the keys that differ between a checkpoint and ``model`` (meta is fine)."""
    entries = read_dcp_metadata(Path(ckpt)).state_dict_metadata.items()
    saved = {
        k[len("model.") :]: tuple(v.size) for k, v in entries if k.startswith("model.") and hasattr(v, "size")
    }
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(wanted) - set(saved))
    shape = sorted(k for k in set(wanted) & set(saved) if wanted[k] != saved[k])
    extra = sorted(set(saved) - set(wanted))
    if missing or shape or extra:
        detail = "; ".join(
            f"{label}: {keys[:4]}{' ...' if len(keys) > 4 else ''}"
            for label, keys in (("missing", missing), ("different shape", shape), ("unexpected", extra))
            if keys
        )
        raise ConfigError(
            f"{ckpt} does not match {model_name} ({detail}). Was it written by a run with other "
            "settings (LoRA on/off, another model)?"
        )


def config_of(ckpt: str | Path) -> Path:
    """The run config that describes a checkpoint: the copy saved in it, else ``runs/<name>/config.yaml``
    (the run folder's may have changed since the save). The path may not exist."""
    ckpt = Path(ckpt)
    return ckpt / "config.yaml" if (ckpt / "config.yaml").is_file() else ckpt.parent.parent / "config.yaml"


@contextlib.contextmanager
def still_there(ckpt: Path) -> Iterator[None]:
    """Re-raise what fails inside the block, unless ``ckpt`` (or a file its marker lists) is gone by then:
    that is then the cause, raised as one ConfigError naming the checkpoint and the ones that verify."""
    try:
        yield
    except Exception as err:
        files = read_marker(ckpt) if is_complete(ckpt) else {}  # {} when the marker is gone too
        gone = [n for n in files or {} if not (ckpt / n).is_file()] or [MARKER] * (files == {})
        if gone:
            what = ", ".join(gone[:3]) if ckpt.is_dir() else "the folder"
            raise ConfigError(
                f"{ckpt} was deleted while convert read it ({what} gone); nothing was written. Convert a "
                "checkpoint that stays (keep-last-K of a run still going removes older ones: copy it first)."
                + checkpoints_near(ckpt)
            ) from err
        raise


@dataclass
class ConvertPlan:
    """What :func:`convert_checkpoint` will do, decided by :func:`plan_convert` before any heavy work."""

    ckpt: Path
    out: Path
    config: Path  # the run config read as data: LoRA settings, seed, the model's name
    cfg: Any  # that TrainConfig with the model and trust_remote_code convert will use

    def describe(self) -> str:
        """One line for people: a plain model, or a LoRA run's adapter merged into its base."""
        cfg = self.cfg
        if not cfg.lora:
            return f"converting {self.ckpt} (model {cfg.model}) to model.safetensors"
        return (
            f"{self.ckpt} is a LoRA run (r={cfg.lora_r}, alpha={cfg.lora_alpha}, "
            f"{','.join(cfg.lora_target_modules)}): merging the adapter into the base model {cfg.model}; the "
            "output is one plain model (to keep the adapter alone, use the run's final_model/adapter)"
        )


def plan_convert(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    model: str | None = None,
    trust_remote_code: bool = False,
) -> ConvertPlan:
    """The checks of :func:`convert_checkpoint` that read no tensor: the path (listing the run's checkpoints
    that verify when it is wrong), the marker, the output folder, and which model to rebuild
    (:mod:`smolfsdp.checkpoint.convert_rules`: the checkpoint's ``config.yaml`` is read as data; the model
    comes from ``model`` or a trusted saved name; ``trust_remote_code`` only from the caller).

    Raises:
        ConfigError: naming the problem and the fix.
    """
    ckpt, out = Path(checkpoint), Path(out_dir)
    if not ckpt.exists():
        raise ConfigError(
            f"{ckpt} does not exist; checkpoints live in runs/<name>/checkpoints/step-N/."
            + checkpoints_near(ckpt)
        )
    if not (ckpt / ".metadata").is_file():
        raise ConfigError(
            f"{ckpt} is not a DCP checkpoint (no .metadata file); checkpoints live in "
            "runs/<name>/checkpoints/step-N/." + checkpoints_near(ckpt)
        )
    if not is_complete(ckpt):
        raise ConfigError(
            f"{ckpt} is incomplete (no {MARKER} marker): its save was interrupted; use an older one."
            + checkpoints_near(ckpt)
        )
    check_convert_out(ckpt, out, overwrite)
    run_config = config_of(ckpt)
    if not run_config.is_file():
        raise ConfigError(
            f"{run_config} is missing: convert needs the run's config (LoRA settings) to rebuild the model."
        )
    saved = load_config(run_config, redacted_ok=True)  # read for the model and LoRA settings only
    tokenizer = saved.tokenizer and convert_model(saved.tokenizer, run_config, ckpt, None, "tokenizer")
    chosen = convert_model(saved.model, run_config, ckpt, model)
    cfg = saved.replace(model=chosen, tokenizer=tokenizer, trust_remote_code=trust_remote_code)
    for name in {chosen, tokenizer or chosen}:  # a folder's own code: refused now, naming convert's own flag
        refuse_remote_code(name, trust_remote_code, option="--trust_remote_code")
    return ConvertPlan(ckpt, out, run_config, cfg)


def convert_checkpoint(
    checkpoint: str | Path | ConvertPlan,
    out_dir: str | Path | None = None,
    *,
    overwrite: bool = False,
    model: str | None = None,
    trust_remote_code: bool = False,
) -> Path:
    """DCP checkpoint -> ``model.safetensors`` + config + tokenizer, in one process, no process group.

    :func:`plan_convert` first (or give its plan): the run's ``config.yaml`` says the LoRA settings and
    names the model, used only when trusted (else ``model`` must say). A LoRA run is written merged (base +
    adapter folded in) so the output is one plain model. The output holds no ``.py`` file and a
    ``smolfsdp_convert.json`` listing its files (what a later ``--overwrite`` may replace).

    Raises:
        ConfigError: not a checkpoint, an incomplete one, one from another model (the differing keys
            are named), an output folder convert must not write (see ``check_convert_out``).
    """
    plan = checkpoint if isinstance(checkpoint, ConvertPlan) else plan_convert(
        checkpoint, out_dir, overwrite=overwrite, model=model, trust_remote_code=trust_remote_code
    )  # fmt: skip
    ckpt, out, cfg = plan.ckpt, plan.out, plan.cfg
    with still_there(ckpt):  # a checkpoint deleted meanwhile (keep-last-K of a run going on) is named
        verify_checkpoint(ckpt, hashes=True, action="convert")
        tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
        # a local model folder's headers before from_pretrained reads its weights (one line, not SafetensorError)
        check_safetensors_folder(cfg.model, build_meta_model(cfg.model, tokenizer, cfg.trust_remote_code))
        built = build_model(cfg.model, tokenizer, seed=cfg.seed, trust_remote_code=cfg.trust_remote_code)
        if cfg.lora:
            built = apply_lora(built, cfg)
        check_matches_model(ckpt, built, f"the model {cfg.model!r} (named by {plan.config})")
        loaded = {"model": built.state_dict()}
        dcp_load(loaded, ckpt)  # no process group: DCP reads every shard in this process
    built.load_state_dict(loaded["model"])
    if cfg.lora:
        built = built.merge_and_unload()
    out.parent.mkdir(parents=True, exist_ok=True)
    # a fresh folder beside OUT (never a fixed name that could be someone's folder), moved in when complete
    for stale in remove_stale_tmps(out):  # a killed convert's leftovers (ours, their process gone)
        print(
            f"smolfsdp convert: removed {stale}, left by an earlier convert that was killed", file=sys.stderr
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp", dir=out.parent))
    try:
        built.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        drop_code_files(tmp)  # the weights travel without code (custom modelling files)
        write_convert_marker(tmp, ckpt, cfg.model)
        umask_modes(tmp)
        if out.exists():
            shutil.rmtree(out)  # check_convert_out: empty, or an earlier convert's files only
        tmp.replace(out)
    except (OSError, SafetensorError) as err:  # a full disk, a read-only folder: named, nothing half-written
        free = shutil.disk_usage(out.parent).free
        raise ConfigError(
            f"writing {out} failed ({err}); {free:,} bytes are free on its filesystem. The partial output was "
            f"removed{' and ' + str(out) + ' kept as it was' if out.exists() else ''}; free space or choose "
            "another folder."
        ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
