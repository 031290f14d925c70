"""One run folder format for every engine: ``runs/<name>/{config.yaml, metrics.jsonl, summary.json}``.

Written by rank 0 of a run (:class:`RunWriter`), read by the chapters (:func:`load_run`). Also the
committed one-GPU measurement of ``scripts/gpu_check.sh`` (:func:`load_gpu_results`, shown by
``smolfsdp.audit.gpu_check.report``) and the provenance it records (:func:`provenance`).

    python -c "from smolfsdp.measure.results import load_run; print(load_run('runs/smoke').summary)"
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata as md
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from smolfsdp.paths import repo_root
from smolfsdp.secrets import redact

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")


def git_sha(cwd: str | Path | None = None) -> str | None:

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd or repo_root(), capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "peft", "accelerate", "datasets"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def hardware() -> dict[str, Any]:
    import torch  # deferred: reading a run folder needs no torch

    info: dict[str, Any] = {"platform": platform.platform(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    else:
        info["gpu"] = None
        info["gpu_count"] = 0
    return info


#: What a smolfsdp run folder may contain; a folder holding anything else is never deleted.
RUN_ENTRIES = {
    "config.yaml",
    "metrics.jsonl",
    "summary.json",
    "summary.json.tmp",
    "final_model",
    "final_model.tmp",
    "final_model.old",
    "checkpoints",
    "traces",
    "trainer",
    "bench.json",
    "mechanics",
}


def check_run_dir(run_dir: Path, *, resume: bool = False, overwrite: bool = False) -> str:
    """Decide what a run may do with ``run_dir`` before anything starts; returns "new", "replace" or "resume".

    Raises:
        FileExistsError: the folder holds files that are not a smolfsdp run's (they are never
            deleted), or it holds checkpoints and the run neither resumes nor was told to overwrite.
    """
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return "new"
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_ENTRIES)
    if foreign or not (run_dir / "config.yaml").is_file():
        raise FileExistsError(
            f"{run_dir} exists and is not a smolfsdp run folder (it holds {foreign[:5] or 'no config.yaml'}); "
            "nothing was deleted. Choose another name or output_dir."
        )
    if resume:
        return "resume"
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and any(ckpts.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{run_dir} holds checkpoints from an earlier run. Continue it with --resume_from latest, or start "
            "over (deleting them) with --overwrite true, or choose another --name."
        )
    return "replace"


def prepare_run_dir(run_dir: Path, *, overwrite: bool = False) -> None:
    """Create ``run_dir``, replacing an earlier run folder there (see :func:`check_run_dir`)."""
    if check_run_dir(run_dir, overwrite=overwrite) == "replace":
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


class RunWriter:
    """Writes a run folder. Only the instance with ``enabled=True`` (rank 0) touches the disk."""

    def __init__(
        self, run_dir: str | Path, enabled: bool = True, resume: bool = False, overwrite: bool = False
    ):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.t0 = time.time()
        self._fh = None
        if enabled:
            if resume:  # keep the folder, its checkpoints and metrics; append
                self.run_dir.mkdir(parents=True, exist_ok=True)
            else:
                prepare_run_dir(self.run_dir, overwrite=overwrite)
            self._fh = (self.run_dir / "metrics.jsonl").open("a", buffering=1)

    def write_config(self, cfg) -> None:
        if self.enabled:
            cfg.save(self.run_dir / "config.yaml", redact_secrets=True)  # for people: no token in it

    def log(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            # no token or secret reaches a file a run writes
            self._fh.write(json.dumps(redact({**record, "time_s": round(time.time() - self.t0, 3)})) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.run_dir / "summary.json"
        if self.enabled:
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(redact(summary), indent=2, default=str))
            tmp.replace(path)  # atomic: a reader never sees half a summary
        return path

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class Run:
    """A finished run, as the chapters read it."""

    path: Path
    config: dict[str, Any]
    metrics: pd.DataFrame
    summary: dict[str, Any]
    log: str | None = None  # the launcher's combined output, when the run was started with capture=True

    @property
    def train(self) -> pd.DataFrame:
        """Train records, one per step (see :meth:`_final`)."""
        return self._final("train")

    @property
    def eval(self) -> pd.DataFrame:
        """Eval records, one per step (see :meth:`_final`)."""
        return self._final("eval")

    def _final(self, split: str) -> pd.DataFrame:
        """One record per step: the last one logged. A run killed after its last checkpoint logged a few
        steps that the resumed run then trained again; ``metrics`` keeps every record as it was written,
        these views keep the trajectory the final model went through."""
        rows = self.metrics[self.metrics["split"] == split]
        if "step" in rows:
            rows = rows.drop_duplicates("step", keep="last").sort_values("step", kind="stable")
        return rows.reset_index(drop=True)


def load_run(path: str | Path) -> Run:
    """Read ``runs/<name>/``. Raises FileNotFoundError naming the missing file."""
    path = Path(path)
    for name in RUN_FILES:
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} is missing: is {path} a finished smolfsdp run?")
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return Run(
        path,
        yaml.safe_load((path / "config.yaml").read_text()),
        pd.DataFrame(rows),
        json.loads((path / "summary.json").read_text()),
    )


# ------------------------------------------------------------------------ committed GPU measurements
#: Where ``scripts/gpu_check.sh``'s files are committed, relative to the repository root.
GPU_RESULTS_DIR = "data/results/h200"
GPU_RESULT_FILES = ("bench.json", "trace_summary.json", "provenance.json")


@dataclass
class GpuResults:
    """One committed run of ``scripts/gpu_check.sh`` (see ``data/results/h200/README.md``)."""

    path: Path
    bench: dict[str, Any]
    trace_summary: dict[str, Any]
    provenance: dict[str, Any]


def load_gpu_results(path: str | Path = GPU_RESULTS_DIR) -> GpuResults | None:
    """The measurement committed in ``path`` (relative paths from the repository root), or None.

    None when ``path`` holds no ``bench.json`` (nothing was measured yet). Raises FileNotFoundError
    when ``bench.json`` is there without ``trace_summary.json`` or ``provenance.json`` (a number
    without its provenance is not shown), and ValueError for a CPU simulation's files (they are
    not a GPU measurement).
    """

    path = Path(path)
    path = path if path.is_absolute() else repo_root() / path
    if not (path / "bench.json").is_file():
        return None
    missing = [n for n in GPU_RESULT_FILES if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} has bench.json but not {missing}: commit every file scripts/gpu_check.sh wrote."
        )
    bench, summary, prov = (json.loads((path / n).read_text()) for n in GPU_RESULT_FILES)
    if bench.get("simulated_cpu"):
        raise ValueError(f"{path}/bench.json comes from --simulate-cpu, not from a GPU: do not commit it.")
    return GpuResults(path, bench, summary, prov)


# ------------------------------------------------------------------------ provenance of a GPU check
def source_sha256(root: Path) -> tuple[str, list[str]]:
    """sha256 over the package, this check and the shipped config: identifies the code without git."""
    files = sorted(root.glob("src/smolfsdp/**/*.py"))
    files += [root / "scripts" / "gpu_check.py", root / "scripts" / "gpu_check.sh"]
    files += [root / "data" / "models" / "smollm3_3b" / "config.json"]
    files = [f for f in files if f.is_file()]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest(), [f.relative_to(root).as_posix() for f in files]


def nvidia_smi() -> dict[str, str] | None:
    """Driver, clocks and power limit as nvidia-smi reports them; None where it is missing or fails."""
    fields = "name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,pstate"
    try:
        proc = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    values = [v.strip() for v in proc.stdout.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def provenance(device, command: str | None) -> dict[str, Any]:
    """GPU, driver, CUDA, every installed distribution's version, git SHA (and a source hash), date.

    ``device``: the ``torch.device`` the check ran on; ``command``: the command line that started it.

    The device machine gets a copy of the working tree that may hold no ``.git``: then the SHA comes
    from ``SMOLFSDP_GIT_SHA`` when the launcher was given one, and ``source_sha256`` identifies the
    code either way.
    """
    import torch  # deferred, as in hardware(): reading a run folder needs no torch

    root = repo_root()
    sha = git_sha()
    env_sha = os.environ.get("SMOLFSDP_GIT_SHA") or None
    digest, files = source_sha256(root)
    cuda = device.type == "cuda"
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "python_command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "git_sha": sha or env_sha,
        "git_sha_source": "git rev-parse HEAD" if sha else ("SMOLFSDP_GIT_SHA" if env_sha else None),
        "source_sha256": digest,
        "source_files": files,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "gpu_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if cuda else None,
        "nvidia_smi": nvidia_smi() if cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "versions": versions(),
        "all_packages": dict(sorted({d.metadata["Name"]: d.version for d in md.distributions()}.items())),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
