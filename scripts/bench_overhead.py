"""Package overhead: the native engine's step time vs a bare FSDP2 loop written here, same work.

Chapter "Reading the profiler". Same tiny SmolLM3, bundled data, batch, AdamW, clip, 2 CPU ranks
(gloo) and number of steps; the bare loop has none of the package's per-step extras (the global
label-token all-reduce, the loss all-reduce, metrics). Also times the TRL engine on the same work
(on CPU the Trainer runs DDP, not FSDP: its ratio compares different strategies, and says so).

    .venv/bin/python scripts/bench_overhead.py [--steps 12] [--warmup 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bare_worker(out: Path, steps: int, warmup: int) -> None:
    """Inside torchrun: the minimal FSDP2 loop."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from smolfsdp.config import load_config
    from smolfsdp.data.prepare import prepare_data
    from smolfsdp.models.modeling import build_model, load_tokenizer, resolve_wrap_class
    from smolfsdp.paths import recipe
    from smolfsdp.sharding.distributed import init_distributed, teardown
    from smolfsdp.sharding.fsdp2 import apply_fsdp2, build_mesh

    info = init_distributed()
    cfg = load_config(recipe("smoke"), fsdp_version=2)
    torch.manual_seed(cfg.seed)
    tok = load_tokenizer("tiny")
    data = prepare_data(cfg, tok)
    model = build_model("tiny", tok, seed=cfg.seed)
    apply_fsdp2(model, build_mesh("cpu", info.world_size), resolve_wrap_class(model))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    sampler = DistributedSampler(
        data.train, info.world_size, info.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    loader = DataLoader(
        data.train,
        batch_size=cfg.per_device_train_batch_size,
        sampler=sampler,
        collate_fn=DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id),
        drop_last=True,
    )
    it, times = iter(loader), []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        batch = next(it)
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0) * 1e3)
    if info.rank == 0:
        out.write_text(json.dumps(times[warmup:]))
    dist.barrier()
    teardown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return bare_worker(Path(args.worker), args.steps, args.warmup)

    from smolfsdp.config import load_config
    from smolfsdp.launch.runner import run_benchmark
    from smolfsdp.launch.torchrun import launch_env
    from smolfsdp.paths import recipe

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bare.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            __file__,
            "--worker",
            str(out),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
        ]
        subprocess.run(cmd, env=launch_env(2), check=True, capture_output=True)
        bare = statistics.median(json.loads(out.read_text()))
        cfg = load_config(
            recipe("smoke"),
            name="native",
            output_dir=tmp,
            fsdp_version=2,
            benchmark_steps=args.steps,
            benchmark_warmup_steps=args.warmup,
        )
        native = run_benchmark(cfg, timeout=900)["summary"]["step_time_ms_median"]
        cfg = load_config(
            recipe("smoke"),
            name="trl",
            output_dir=tmp,
            engine="trl",
            fsdp_version=2,
            benchmark_steps=args.steps,
            benchmark_warmup_steps=args.warmup,
        )
        trl_bench = run_benchmark(cfg, timeout=900)  # the same StepMeter, hooked into the Trainer
        trl_ms = trl_bench["summary"]["step_time_ms_median"]
        trl_strategy = trl_bench["strategy"]
    print(f"bare FSDP2 loop      : {bare:8.1f} ms/step (median of {args.steps}, 2 CPU ranks, gloo)")
    print(f"native engine (FSDP2): {native:8.1f} ms/step  ratio {native / bare:.3f}")
    print(
        f"TRL engine ({trl_strategy:5s})   : {trl_ms:8.1f} ms/step  ratio {trl_ms / bare:.3f}"
        + ("  (the Trainer ran DDP on CPU, not FSDP)" if trl_strategy == "ddp" else "")
    )


if __name__ == "__main__":
    main()
