"""Start a run from Python: check everything that can fail first, launch the ranks, return the run.

``run(cfg)`` is what chapters and tests call: it checks the configuration before anything starts
(:func:`preflight`: :func:`smolfsdp.launch.validate.validate`, the output folder, the data, the model,
the checkpoint to resume from, the disk), launches ``cfg.nproc`` processes with torchrun
(:func:`smolfsdp.launch.torchrun.launch`), and returns the finished run folder (``results.Run``).
Each launched process runs :func:`smolfsdp.train.sft.train`.

    from smolfsdp.config import load_config
    from smolfsdp.launch import runner
    run = runner.run(load_config("configs/runs/smoke.yaml", max_steps=4))
    bench = runner.run_benchmark(load_config("configs/runs/smoke.yaml", benchmark_steps=5))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from smolfsdp import quiet
from smolfsdp.checkpoint.dcp import (
    check_disk_space_each,
    check_engine,
    check_matches_model,
    check_resume_settings,
    checkpoint_dir,
    complete_checkpoints,
    estimate_checkpoint_bytes,
    resolve_resume,
)
from smolfsdp.config import TrainConfig
from smolfsdp.data.prepare import prepare_data, too_long_hint
from smolfsdp.errors import ConfigError
from smolfsdp.launch.host_checks import check_model_fits_data, check_output_dir, check_tied_head
from smolfsdp.launch.progress import HEARTBEAT_S, heartbeat, in_notebook, live_say, rank0_progress
from smolfsdp.launch.torchrun import launch
from smolfsdp.launch.validate import validate
from smolfsdp.measure.benchmark import load_bench
from smolfsdp.measure.results import check_run_dir, load_run
from smolfsdp.models.modeling import (
    build_meta_model,
    check_safetensors_folder,
    load_tokenizer,
    resolve_wrap_class,
)
from smolfsdp.paths import repo_root
from smolfsdp.sharding.distributed import check_offload_support
from smolfsdp.sharding.lora import apply_lora


def preflight(cfg: TrainConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every check that can fail before processes start: the composed config checks
    (:func:`smolfsdp.launch.validate.validate`: model name, mesh, launch fields), output folder (writable, run not already
    going), tokenizer and chat template, data file, column mapping, rows left after filtering, model
    preset, ``max_length`` within the model's positions, tied head vs checkpoint, wrap class.

    Raises ConfigError with the problem and the fix. Returns what it found (for logs). ``progress``
    (the CLI passes a printer) is told each slow stage as it starts: tokenising, then the model's shapes.
    """
    say = progress or (lambda _msg: None)
    validate(cfg)  # model name, mesh, launch fields: milliseconds, before any tokenizer or data
    quiet.install()  # apply_lora below builds a PeftModel in this process (transformers FutureWarning)
    check_output_dir(cfg)  # a folder, writable, and this run not already going (its lock)
    try:
        check_run_dir(cfg.run_dir, resume=bool(cfg.resume_from), overwrite=cfg.overwrite)
    except FileExistsError as err:
        raise ConfigError(str(err)) from err
    check_offload_support(cfg.fsdp_version, cfg.cpu_offload)  # FSDP1 offload on a CPU-only machine
    say(f"checking the data: loading the tokenizer of {cfg.model} and tokenising {cfg.dataset}")
    tokenizer = load_tokenizer(cfg.model, cfg.tokenizer, cfg.trust_remote_code)
    data = prepare_data(cfg, tokenizer)
    st = data.stats()
    say(
        f"data: {st['kept']:,} of {st['rows_in']:,} rows kept, {st['train_rows']:,} train / "
        f"{st['eval_rows']:,} eval; checking the model's shapes (meta device, no weights)"
    )
    per_step = cfg.nproc * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    if len(data.train) < per_step:
        raise ConfigError(
            f"{len(data.train)} {'packed ' if cfg.packing else ''}training rows cannot fill one optimizer step of "
            f"{cfg.nproc} processes x "
            f"{cfg.per_device_train_batch_size} rows x {cfg.gradient_accumulation_steps} accumulation steps = "
            f"{per_step} rows. Add rows, or lower per_device_train_batch_size, nproc or eval_size."
            + too_long_hint(data.counts, cfg)
        )
    meta = build_meta_model(cfg.model, tokenizer, cfg.trust_remote_code)
    check_model_fits_data(cfg, meta)  # max_length within the model's positions
    check_safetensors_folder(cfg.model, meta)  # a local folder's headers: offsets and shapes vs the config
    check_tied_head(cfg.model, meta)  # config.json's tie_word_embeddings agrees with the checkpoint
    wrap_cls = resolve_wrap_class(meta, cfg.wrap_class)
    if cfg.lora:
        meta = apply_lora(meta, cfg)  # target modules exist, dtypes per FSDP group agree
    resume_path = None
    if cfg.resume_from:
        resume_path = resolve_resume(cfg.resume_from, cfg.run_dir, hashes=True)  # every byte, before launch
        check_engine(resume_path, cfg.engine)
        check_matches_model(resume_path, meta, cfg.model)
        check_resume_settings(resume_path, cfg)
    ckpt_bytes, final_bytes = bytes_to_write_each(cfg, meta, resume_path)
    # each on the filesystem that holds it: checkpoints/ may be a symlink to another disk
    check_disk_space_each(
        [(checkpoint_dir(cfg.run_dir), ckpt_bytes), (cfg.run_dir / "final_model", final_bytes)]
    )
    return {"data": data.stats(), "wrap_class": wrap_cls.__name__}


def bytes_to_write(cfg: TrainConfig, meta_model, resume_path=None) -> int:
    """The bytes of :func:`bytes_to_write_each`, checkpoints and final model together."""
    return sum(bytes_to_write_each(cfg, meta_model, resume_path))


def bytes_to_write_each(cfg: TrainConfig, meta_model, resume_path=None) -> tuple[int, int]:
    """Disk bytes a run adds at its peak, as (checkpoints, final model): the checkpoints it will hold at
    once beyond those already there, and the final model (or adapter). Estimated on the meta-device model.

    ``save_total_limit + 1`` checkpoints at most are on disk at once (the new one is complete before the
    oldest goes). A run resumed from ``resume_path`` (``step-N``) writes only the saves after step N, and
    its run folder's complete checkpoints already take their space (keep-last-K removes them as new ones
    complete): it adds ``min(kept + new, K + 1) - kept`` checkpoints.
    """
    n_ckpt = 0
    if cfg.save_steps > 0:
        start = int(resume_path.name.split("-")[-1]) if resume_path is not None else 0
        kept = len(complete_checkpoints(checkpoint_dir(cfg.run_dir))) if resume_path is not None else 0
        total = cfg.max_steps if cfg.max_steps > 0 else None
        new = cfg.save_total_limit + 1 if total is None else total // cfg.save_steps - start // cfg.save_steps
        n_ckpt = max(0, min(kept + new, cfg.save_total_limit + 1) - kept)
    ckpt = estimate_checkpoint_bytes(meta_model) if n_ckpt else 0
    final = 0
    if cfg.save_final_model:
        params = [p for p in meta_model.parameters() if (p.requires_grad or not cfg.lora)]
        final = sum(p.numel() * 4 for p in {id(p): p for p in params}.values())
    return n_ckpt * ckpt, final


def run(
    cfg: TrainConfig,
    *,
    capture: bool = False,
    timeout: float | None = None,
    progress: Callable[[str], None] | bool | None = None,
):
    """Check ``cfg``, launch ``cfg.nproc`` processes, wait, and return the finished run (``results.Run``).

    ``capture``: keep the output in ``Run.log`` instead of printing it all. ``progress``: with ``capture``,
    still show progress while the run goes on: ``True`` shows rank 0's lines and the progress bar every 9 s
    (:func:`smolfsdp.launch.progress.rank0_progress`: page-safe, paths relative to the repository or to
    ``cfg.output_dir``, no third-party warning line), and a "still running" line wherever nothing else was said
    for 9 s (:class:`smolfsdp.launch.progress.heartbeat`: the ranks' start-up), or a callable is given every
    line of output as it arrives; ``None`` (the default): ``True`` inside a Jupyter kernel (a chapter's cell, a reader's notebook:
    :func:`smolfsdp.launch.progress.in_notebook`), so no cell waits in silence; off elsewhere; ``False``: off.
    In a kernel the lines go to the cell's live display (:func:`smolfsdp.launch.progress.live_say`): seen while
    the run goes on, emptied when the cell ends, so the saved notebook and the page keep none of them.
    ``Run.log`` keeps every line either way. Raises ConfigError before launching on bad input, RuntimeError if
    the launched run fails.
    """
    preflight(cfg)
    progress = in_notebook() if progress is None else progress
    # streamed: a line every HEARTBEAT_S seconds where the run says nothing (its ranks' start-up), so no cell waits
    # in silence; its own lines go through beat.relay and restart the count
    # (live_say: in a kernel the cell's live display, emptied when the cell ends; else the terminal)
    beat = heartbeat(f"run {cfg.name!r}", HEARTBEAT_S if progress is True and capture else None, live_say())
    on_line = (
        rank0_progress(beat.relay, roots=[repo_root(), cfg.output_dir]) if progress is True else progress
    )
    with beat:
        proc = launch(cfg, capture=capture, timeout=timeout, on_line=(on_line or None) if capture else None)
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-4000:] if capture else "(see the output above)"
        raise RuntimeError(f"run {cfg.name!r} failed with exit code {proc.returncode}:\n{tail}")
    result = load_run(cfg.run_dir)
    result.log = proc.stdout if capture else None
    return result


def run_benchmark(cfg: TrainConfig, *, timeout: float | None = None) -> dict[str, Any]:
    """Launch ``cfg`` (with ``benchmark_steps > 0``) through :func:`run`; return its bench.json
    (:func:`smolfsdp.measure.benchmark.load_bench`).

    Raises ConfigError if ``cfg`` is not in benchmark mode, RuntimeError if the run fails.
    """
    if cfg.benchmark_steps <= 0:
        raise ConfigError("run_benchmark needs benchmark_steps > 0.")
    run(cfg, capture=True, timeout=timeout)
    return load_bench(cfg.run_dir)
