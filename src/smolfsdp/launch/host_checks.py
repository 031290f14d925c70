"""Checks the launcher runs before it starts any process: the output folder, one run per name, and
whether this node has the cores, memory and GPUs for ``nproc`` ranks.

``smolfsdp.launch.torchrun.launch`` holds :func:`run_lock` for the run's whole life and calls
:func:`check_resources`; ``smolfsdp.launch.runner.preflight`` calls :func:`check_output_dir` (which also fails fast
when the run is already running) before it tokenizes anything.

    python -c "from smolfsdp.launch.host_checks import check_resources; from smolfsdp.config import TrainConfig; \
check_resources(TrainConfig(nproc=64))"
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

#: A CPU run refuses more than this many ranks per core on one node: each rank needs a core to make
from smolfsdp.config import TrainConfig
from smolfsdp.errors import ConfigError

#: progress, and beyond a few per core they mostly wait on each other (gloo collectives) and on memory.
#: Above one rank per core the launcher still starts them, with a warning.
MAX_RANKS_PER_CORE = 4
#: Memory one CPU rank holds at least: measured 434 MiB RSS for a smoke rank after its imports (torch,
#: transformers, datasets) and the tiny model, before any training; a larger model needs more.
RANK_MIN_BYTES = 512 * 2**20


def lock_path(cfg: TrainConfig) -> Path:
    """``<output_dir>/.<name>.lock`` (``.<name>.node<k>.lock`` on multi-node runs, whose nodes may share
    ``output_dir``): beside the run folder, never in it, so the folder holds only what a run writes and
    replacing it (``--overwrite``) cannot take the lock's file away."""
    node = f".node{cfg.node_rank}" if cfg.nnodes > 1 else ""
    return Path(cfg.output_dir) / f".{cfg.name}{node}.lock"


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_dir(cfg: TrainConfig) -> None:
    """``output_dir`` is (or can be created as) a writable folder, the run folder is not a file, and no
    other launcher holds this run's lock.

    Writability is probed by creating and removing a file in the nearest existing folder (``os.access``
    says yes to root even on a read-only mount).

    Raises:
        ConfigError: naming the path, what is wrong with it and the fix.
    """
    out = Path(cfg.output_dir)
    for path in (out, cfg.run_dir):
        if path.exists() and not path.is_dir():
            raise ConfigError(
                f"{str(path)!r} is a file, not a folder, so the run cannot write there; give output_dir a folder "
                "(e.g. --output_dir runs) or another --name."
            )
    base = _nearest_existing(out)
    if not base.is_dir():
        raise ConfigError(
            f"output_dir={str(out)!r}: {str(base)!r} is a file, so the folder cannot be created."
        )
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        raise ConfigError(
            f"output_dir={str(out)!r} is not writable ({err.strerror} in {str(base)!r}); choose a folder you can "
            "write to with --output_dir."
        ) from err
    with run_lock(cfg):  # fails now, before data and model, when the same run is already going
        pass


@contextlib.contextmanager
def run_lock(cfg: TrainConfig) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on :func:`lock_path` while the block runs; refuse a second run of the
    same name and ``output_dir`` while the first is going (two launchers would write one folder).

    The lock file holds the holder's pid and is removed on exit while still locked; an acquirer that
    finds its file already removed (the holder just finished) retries on a fresh one.

    Raises:
        ConfigError: another launcher holds the lock (its pid named).
    """
    path = lock_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(
                f"Run {cfg.name!r} in {cfg.output_dir!r} is already running (launcher pid {holder} holds "
                f"{path}); wait for it to end, stop it, or start this one with another --name."
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder removed this file after we opened it: lock a fresh one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)


def available_memory_bytes() -> int:
    """Memory the OS can give new processes now (psutil's ``available``: free + reclaimable cache)."""
    import psutil  # deferred: only the launcher needs it (a dependency of accelerate)

    return int(psutil.virtual_memory().available)


def check_resources(cfg: TrainConfig, *, cpu_count: int | None = None, gpu_count: int | None = None) -> None:
    """Refuse an ``nproc`` this node cannot run, before any process starts.

    Per node (``nproc // nnodes`` ranks): with GPUs, one GPU per rank; on CPU at most
    :data:`MAX_RANKS_PER_CORE` ranks per core (a warning above one per core) and
    on every node the ranks' host memory (:func:`check_host_memory`: imports plus the model as loaded). ``cpu_count``/``gpu_count`` default to
    this machine's (``os.cpu_count()``, ``torch.cuda.device_count()``).

    Raises:
        ConfigError: too many ranks for this node's GPUs, cores or memory, naming the limit.
    """
    ranks = cfg.nproc // cfg.nnodes
    if gpu_count is None:
        import torch  # deferred: the launcher's other checks do not need it

        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpu_count:
        check_triton_toolchain(cfg)
        if ranks > gpu_count:
            raise ConfigError(
                f"nproc={cfg.nproc} starts {ranks} ranks on this node but it has {gpu_count} GPU(s); each rank "
                f"needs its own (smolfsdp.sharding.distributed puts rank k on cuda:k). Use --nproc {gpu_count * cfg.nnodes} (or "
                "more nodes), or CUDA_VISIBLE_DEVICES= to run the ranks on CPU."
            )
        check_host_memory(cfg, ranks)  # every rank loads the whole model on the host first
        return
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    if ranks > MAX_RANKS_PER_CORE * cores:
        raise ConfigError(
            f"nproc={cfg.nproc}: {ranks} CPU ranks on {cores} core(s) is more than {MAX_RANKS_PER_CORE} per core; they "
            f"would mostly wait on each other and on memory. Use --nproc {min(cores, ranks)} or fewer (2 for the "
            "smoke run)."
        )
    check_host_memory(cfg, ranks)
    if ranks > cores:
        print(
            f"[smolfsdp] warning: {ranks} CPU ranks on {cores} core(s): they will share cores and run slowly",
            file=sys.stderr,
            flush=True,
        )


def triton_toolchain_missing() -> list[str]:
    """What Triton needs to build its kernels at the first step and this machine lacks: the ``triton``
    module, a C compiler (``$CC``, ``cc``, ``gcc`` or ``clang``, as ``triton.runtime.build`` looks) and the
    Python headers (``Python.h`` under ``sysconfig``'s include folder). Empty when all are there."""

    missing = []
    if importlib.util.find_spec("triton") is None:
        missing.append("the triton module")
    if not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
        missing.append("a C compiler (cc, gcc or clang; or set CC)")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        missing.append(f"Python.h (in {sysconfig.get_paths()['include']}; e.g. apt-get install python3-dev)")
    return missing


def check_triton_toolchain(cfg: TrainConfig, missing: list[str] | None = None) -> None:
    """On GPUs the TRL engine's chunked log-prob loss compiles Triton kernels at the first step
    (``trl.kernels.chunked_logprob``): refuse before data prep and the model load when Triton cannot build.
    ``missing`` defaults to :func:`triton_toolchain_missing`. Raises ConfigError naming what is missing."""
    if cfg.engine != "trl":
        return
    missing = triton_toolchain_missing() if missing is None else missing
    if missing:
        raise ConfigError(
            f"engine=trl on GPUs compiles TRL's chunked log-prob Triton kernels at the first step, but this "
            f"machine lacks {', '.join(missing)}; install them, or use engine: native (no Triton)."
        )


def loaded_model_bytes(model: str) -> int:
    """Host bytes one rank holds for ``model`` as loaded: parameters x 4 (every rank builds the whole model in
    fp32 before FSDP shards it; ``measure.memory.estimate_memory``'s ``every-rank`` loading). 0 when its
    config cannot be read here (a hub id not cached: the download check speaks for it)."""
    from smolfsdp.estimate.params import count_parameters, resolve_model_config  # deferred: transformers

    try:  # never the Hub: a hub id is read from the local cache or not at all (no retries here)
        config = resolve_model_config(model, local_files_only=True)
    except (ConfigError, OSError, ValueError):
        return 0
    return count_parameters(config).total * 4


def check_host_memory(cfg: TrainConfig, ranks: int) -> None:
    """Refuse ``ranks`` ranks whose host memory (:data:`RANK_MIN_BYTES` of imports plus the model as loaded,
    :func:`loaded_model_bytes`) exceeds what is available. Raises ConfigError naming the sizes."""
    per_rank = RANK_MIN_BYTES + loaded_model_bytes(cfg.model)
    need, free = ranks * per_rank, available_memory_bytes()
    if need > free:
        raise ConfigError(
            f"nproc={cfg.nproc}: {ranks} ranks need at least {need / 2**30:.1f} GiB of host memory "
            f"({per_rank / 2**30:.2f} GiB each: {RANK_MIN_BYTES / 2**20:.0f} MiB of imports + model={cfg.model!r} "
            f"in fp32 as loaded) but {free / 2**30:.1f} GiB is available; the out-of-memory killer would end the "
            f"run. Use --nproc {max(1, free // per_rank)} or fewer, or a machine with more memory."
        )


#: A model this large is trained on GPUs only: one 2048-token step of 1 B parameters on CPU ranks takes
#: minutes (6 x 1e9 x 2048 FLOPs = 12 TFLOP at under 0.1 TFLOP/s per core); the smoke models are 0.01 B.
GPU_ONLY_PARAMS = 10**9


def _hub_config_cached(model: str) -> bool:
    from huggingface_hub import try_to_load_from_cache  # deferred: only for hub ids

    return isinstance(try_to_load_from_cache(model, "config.json"), str)


def _hub_reachable(timeout_s: float = 5.0) -> str | None:
    """None when one request to the Hub's endpoint answers within ``timeout_s`` (no retries), else why not."""

    from huggingface_hub import constants  # deferred: only for uncached hub ids

    try:
        urllib.request.urlopen(constants.ENDPOINT, timeout=timeout_s).close()  # noqa: S310  (the Hub's https URL)
    except OSError as err:
        return f"{constants.ENDPOINT} did not answer in {timeout_s:.0f} s ({type(err).__name__})"
    return None


def check_runs_here(cfg: TrainConfig, *, gpu_count: int | None = None, hub_problem=None) -> None:
    """Refuse, in one line and before any rank starts or any run folder is made, a run this machine cannot
    do: a model of :data:`GPU_ONLY_PARAMS` or more parameters with no CUDA GPU, or a hub model whose
    config is not in the local cache while ``HF_HUB_OFFLINE`` is set or the Hub does not answer (one
    request, ``hub_problem()`` = :func:`_hub_reachable`; no retries). Raises ConfigError naming the fix."""
    if gpu_count is None:
        import torch  # deferred

        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n_params = loaded_model_bytes(cfg.model) // 4
    if not gpu_count and n_params >= GPU_ONLY_PARAMS:
        raise ConfigError(
            f"model={cfg.model} ({n_params / 1e9:.2f} B parameters) trains on CUDA GPUs (nproc={cfg.nproc}, one "
            "per rank) and this machine has none: run it on a GPU machine, or try configs/runs/smoke.yaml here."
        )
    local = cfg.model in ("tiny", "smollm3-3b") or Path(cfg.model).expanduser().exists()
    if local or "/" not in cfg.model or _hub_config_cached(cfg.model):
        return
    from huggingface_hub import constants  # deferred: only for hub ids

    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else (hub_problem or _hub_reachable)()
    if why:
        raise ConfigError(
            f"model={cfg.model} is not in the local Hugging Face cache and the Hub cannot be reached ({why}): "
            f"download it where there is network (hf download {cfg.model}), or give a local folder as model."
        )


# ------------------------------------------------------------------------------ model against config
def check_model_fits_data(cfg: TrainConfig, meta_model) -> None:
    """``max_length`` within the model's ``max_position_embeddings`` (rows that long would index positions
    the model was never built for).

    Raises:
        ConfigError: naming both numbers and the fix.
    """
    limit = getattr(meta_model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and cfg.max_length > limit:
        raise ConfigError(
            f"max_length={cfg.max_length} is more than {cfg.model!r} has positions (max_position_embeddings="
            f"{limit}); use --max_length {limit} or less."
        )


def checkpoint_tensor_names(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the ``.safetensors`` file holding it, for a local model folder (its index, or every
    ``*.safetensors`` file's header); empty when the folder holds no safetensors."""
    from safetensors import safe_open  # deferred: only local model folders need it

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return {k: model_dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    names: dict[str, Path] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names.update(dict.fromkeys(f.keys(), path))
    return names


def check_tied_head(model: str, meta_model) -> None:
    """For a local model folder: its ``config.json`` ``tie_word_embeddings`` agrees with its checkpoint.

    Tied, but the checkpoint holds an ``lm_head.weight`` unlike ``embed_tokens``: transformers then loads
    the head untied (with a warning) while every check before launch built the tied model. Untied, but no
    ``lm_head.weight`` is stored: the head would start from random values.

    Raises:
        ConfigError: either mismatch, naming the file and the fix.
    """
    model_dir = Path(model).expanduser()
    if not model_dir.is_dir():
        return  # a preset or a hub id: its checkpoint is not here to compare
    tied = bool(getattr(meta_model.config.get_text_config(), "tie_word_embeddings", False))
    names = checkpoint_tensor_names(model_dir)
    head = next((k for k in names if k.endswith("lm_head.weight")), None)
    embed = next((k for k in names if k.endswith("embed_tokens.weight")), None)
    if not names or embed is None:
        return
    config = model_dir / "config.json"
    if not tied and head is None:
        raise ConfigError(
            f"{config} says tie_word_embeddings: false but the checkpoint holds no lm_head.weight, so the output "
            "head would start from random values. Set tie_word_embeddings: true there (the head is the "
            "embedding), or use a checkpoint saved with its head."
        )
    if tied and head is not None:
        from safetensors import safe_open  # deferred: only reading a saved model needs it

        tensors = []
        for name in (head, embed):
            with safe_open(str(names[name]), "pt") as f:
                tensors.append(f.get_tensor(name))
        if tensors[0].shape != tensors[1].shape or not bool((tensors[0] == tensors[1]).all()):
            raise ConfigError(
                f"{config} says tie_word_embeddings: true but the checkpoint holds a separate lm_head.weight "
                "that differs from embed_tokens.weight: transformers would train it untied while the checks "
                "before launch assume tied. Set tie_word_embeddings: false there to train the separate head, or "
                "remove lm_head.weight from the checkpoint to tie it to the embedding."
            )
