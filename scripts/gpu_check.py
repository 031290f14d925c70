"""GPU check (issue 13): the SmolLM3-3B geometry on one GPU, measured beside smolfsdp's estimates.

Started by ``scripts/gpu_check.sh`` (which sets PYTHONPATH=src and HF_HUB_OFFLINE=1, keeps a log and
nvidia-smi readings); the measuring code is ``smolfsdp.audit.gpu_check.measure_gpu``. Writes flat files into --out:
bench.json, trace_summary.json, provenance.json and one trace_<shape>.json.gz.

    OUT=/tmp/h200 bash scripts/gpu_check.sh                  # on the lent GPU machine
    PYTHONPATH=src python3 scripts/gpu_check.py --simulate-cpu --out /tmp/sim   # CPU, seconds

Order, so that a wrong machine is told at once: the arguments; torch alone and the GPU refusals
("no CUDA GPU"); the import check (``REQUIRED``: every third-party module this path imports, checked
by tests/test_gpu_check.py), which names what is missing; only then the measuring code. The GPU
machine's image (its package list: tests/data/h200_packages.txt) has torch, transformers,
accelerate and peft but not trl, datasets or ijson, so nothing on this path may need them
(``smolfsdp.traces.load`` reads traces with the standard library without ijson). Working files
(the profiler's raw traces) go to a temporary folder outside ``--out``, removed on exit, also on
SIGTERM (what ``timeout`` sends): ``--out`` never holds more than the flat files listed above.
A shape that fails (out of memory or any other error) is recorded in bench.json with its error; the other
shapes still run and their results and trace are kept (exit status 1 then). The process group is gloo
(``smolfsdp.audit.gpu_check.group``), NCCL only if gloo fails a tiny FSDP2 step on the GPU, said in bench.json.
"""

import argparse
import gc
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: Modules the check imports, and what each is needed for.
REQUIRED = {
    "torch": "tensors, FSDP2, the profiler",
    "transformers": "SmolLM3Config / SmolLM3ForCausalLM",
    "numpy": "trace analysis",
    "pandas": "trace analysis",
    "tqdm": "smolfsdp.traces.load (progress bar)",
    "yaml": "smolfsdp.config",
    "psutil": "smolfsdp.measure.benchmark",
    "smolfsdp.audit.gpu_check.measure_gpu": "the measurement (src/ on PYTHONPATH)",
    "smolfsdp.audit.gpu_check.profiled_window": "the trace checks and analyze-trace",
}
#: Imported where present, read without otherwise (not on the GPU machine's image).
OPTIONAL = {
    "ijson": "smolfsdp.traces.load: faster trace parsing; the standard library reads without it",
    "trl": "smolfsdp.data.packing (loaded with train.steps): TRL's packer and padding-free collator, which the "
    "check never calls (it feeds random full rows)",
}


def check_gpu(simulate_cpu: bool) -> None:
    """Refuse the wrong machine (no GPU for the real check, a GPU for the simulation), importing torch only."""
    check_imports(["torch"])
    import torch  # deferred: named by check_imports when missing

    if not simulate_cpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA GPU is visible; on a machine without one run --simulate-cpu")
    if simulate_cpu and torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: --simulate-cpu with a GPU visible; set CUDA_VISIBLE_DEVICES='' (the launcher does)"
        )


def check_imports(names: list[str] | None = None) -> None:
    """Import every module the check needs (or ``names``); exit naming the missing one and the fix."""
    for name in names or REQUIRED:
        why = REQUIRED[name]
        try:
            importlib.import_module(name)
        except ImportError as err:
            hint = (
                "put the checkout's src/ on PYTHONPATH (scripts/gpu_check.sh does)"
                if name.startswith("smolfsdp")
                else "install it, or carry it to the GPU machine as a wheel"
            )
            sys.exit(f"gpu_check: cannot import {name} ({why}): {err}. Fix: {hint}.")
    if names is None:
        from transformers import SmolLM3Config, SmolLM3ForCausalLM  # noqa: F401  (in 5.17 and 5.24)


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="folder for the flat output files")
    p.add_argument("--simulate-cpu", action="store_true", help="tiny SmolLM3 on CPU, same code path (CI)")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--timed-steps", type=int, default=10)
    p.add_argument("--command", default=None, help="the exact command that started the check (provenance)")
    return p.parse_args(argv)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _print_table(bench: dict[str, Any], checks: dict[str, Any]) -> None:
    cal = bench["calibration"]
    print(
        f"matmul ceiling {cal['matmul']['tflops_median']:.1f} TFLOP/s; datasheet {cal['datasheet_peak_tflops']}"
    )
    print(
        f"{'shape':<18}{'ms':>9}{'tok/s':>10}{'TFLOP/s':>9}{'MFU':>7}{'/matmul':>8}{'peak/est':>9}{'static/est':>11}{'nccl':>6}"
    )
    for c in bench["configs"]:
        if "error" in c:
            print(f"{c['name']:<18}{c['error'][:90]}")
            continue
        s, m = c["summary"], c["memory"]
        mfu = f"{s['mfu_median']:.3f}" if s["mfu_median"] is not None else "-"
        pk = f"{m['peak_ratio']:.3f}" if m["peak_ratio"] is not None else "-"
        print(
            f"{c['name']:<18}{s['step_time_ms_median']:>9.1f}{s['tokens_per_s_median']:>10.0f}"
            f"{s['tflops_median']:>9.2f}{mfu:>7}{s['mfu_vs_matmul_median']:>8.3f}{pk:>9}"
            f"{m['static']['ratio']['params+optimizer']:>11.4f}{checks[c['name']]['nccl_kernels']:>6}"
        )
    for c in bench["configs"]:  # the peak of each step phase against the dry run's moments in it
        for phase, p in c.get("memory", {}).get("phases", {}).items():
            got, est = p["measured_bytes"], p["estimated_bytes"]
            err = f"{p['error_pct']:+.1f} %" if p["error_pct"] is not None else "-"
            print(f"  {c['name']:<16}{phase:<10} measured {_gib(got)} estimated {_gib(est)} error {err}")


def main(argv: list[str] | None = None) -> int:
    """Run the check; write bench.json, trace_summary.json, provenance.json and one trace into ``--out``."""
    args = parse_args(argv)
    check_gpu(args.simulate_cpu)
    check_imports()
    # SIGTERM (timeout's signal) unwinds like an exception, so the working folder below is removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="smolfsdp_gpu_check_"))
    try:
        return _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(args, work: Path) -> int:
    """The measurements, with the profiler's working traces under ``work`` (outside ``args.out``)."""
    # deferred until check_gpu() and check_imports() have refused a wrong machine or named what is missing
    import torch
    import torch.distributed as dist

    from smolfsdp.audit.gpu_check.group import single_process_group
    from smolfsdp.audit.gpu_check.measure_gpu import (
        ADAMW,
        BENCH,
        PROVENANCE,
        RECIPE,
        TRACE_SUMMARY,
        make_plan,
        run_shape,
    )
    from smolfsdp.audit.gpu_check.profiled_window import check_trace, keep_trace, run_analyze_trace
    from smolfsdp.estimate.params import resolve_model_config
    from smolfsdp.measure import benchmark
    from smolfsdp.measure.results import provenance
    from smolfsdp.measure.timing import measure_matmul_tflops
    from smolfsdp.sharding.distributed import teardown

    plan = make_plan(args.simulate_cpu, args.warmup_steps, args.timed_steps)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[gpu_check {time.time() - t0:6.1f}s] {msg}", flush=True)

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    backend, backend_note = single_process_group(device)  # gloo; NCCL only if gloo fails, said
    assert dist.get_world_size() == 1, "the check runs one process (world size 1), not under torchrun"
    info = SimpleNamespace(device=device, backend=backend)
    if backend_note:
        log(backend_note)
    config = resolve_model_config("tiny" if plan.simulate_cpu else "smollm3-3b")
    prov = provenance(info.device, args.command)
    log(f"device {prov['gpu'] or 'cpu'}; torch {torch.__version__}; world size 1 ({info.backend})")
    calibration = measure_matmul_tflops(info.device, plan.matmul_n, plan.matmul_iters)
    ceiling = calibration["tflops_median"]
    peak, source = benchmark.peak_tflops(prov["gpu"])
    log(f"matmul {plan.matmul_n}^3 bf16: {ceiling:.1f} TFLOP/s (median of {plan.matmul_iters})")
    bench = {
        "check": "smolfsdp gpu_check (issue 13)",
        "simulated_cpu": plan.simulate_cpu,
        "device": info.device.type,
        "device_name": prov["gpu"],
        "world_size": 1,
        "process_group": {"backend": backend, "why_not_gloo": backend_note},
        "model": {
            "config": "tiny preset (smolfsdp.models.modeling.tiny_config)" if plan.simulate_cpu
            else "data/models/smollm3_3b/config.json",
            "weights": "random (seed 0); token ids random (seed 1), every position a real token",
            "attn_implementation": "sdpa",
            "param_dtype": "float32", "compute_dtype": "bfloat16 (FSDP2 MixedPrecisionPolicy, fp32 reduce)",
            "sharding": "FSDP2 fully_shard per decoder layer + root, 1-D mesh of 1",
            "optimizer": "torch.optim.AdamW(lr=1e-5, fused=True); clip_grad_norm_ 1.0",
            "estimator_recipe": RECIPE, "estimator_adamw": ADAMW,
        },
        "calibration": {
            "matmul": calibration,
            "datasheet_peak_tflops": peak,
            "datasheet_source": source,
            "ceiling_fraction_of_datasheet": ceiling / peak if peak else None,
        },
        "units": {
            "step_time_ms": "milliseconds per optimizer step", "tokens_per_s": "tokens per second",
            "tflops": "model TFLOP/s (6N + 12LHQT per token, PaLM appendix B; recompute not counted)",
            "mfu": "fraction of the datasheet bf16 dense peak", "mfu_vs_matmul": "fraction of the measured matmul",
            "*_bytes": "bytes",
        },
        "configs": [],
    }  # fmt: skip
    summary: dict[str, Any] = {"trace_file": None, "trace_shape": None, "analyze_trace": None, "checks": {}}

    # written after every shape: a run cut short by the device's time limit keeps what it measured
    def write() -> None:
        for name, obj in ((BENCH, bench), (TRACE_SUMMARY, summary), (PROVENANCE, prov)):
            (out / name).write_text(json.dumps(obj, indent=2, default=str) + "\n")

    traces, failed = {}, []
    for shape in plan.shapes:
        try:
            record, trace = run_shape(config, shape, plan, info.device, ceiling, work, log)
        except Exception as err:  # noqa: BLE001  recorded, not hidden: the other shapes still count
            oom = isinstance(err, torch.OutOfMemoryError)
            record = {
                "name": shape.name,
                "error": f"{type(err).__name__}: {err}"[:2000],
                "out_of_memory": oom,
            }
            trace = None
        if trace is None:
            failed.append(shape.name)
            bench["configs"].append(record)
            log(f"{shape.name}: FAILED ({record['error'][:80]}); going on with the next shape")
            gc.collect()  # the failed shape's model and optimizer are garbage once the exception is gone
            torch.cuda.empty_cache()
            write()
            continue
        bench["configs"].append(record)
        write()  # the measurement is safe before its trace is read
        summary["checks"][shape.name] = check_trace(trace, config.num_hidden_layers)
        traces[shape.name] = trace
        write()
    real = next(s.name for s in plan.shapes if s.real_run)
    kept = keep_trace(traces, real, out) if traces else None
    summary["trace_file"] = kept
    summary["trace_shape"] = kept and kept[len("trace_") : -len(".json.gz")]
    summary["analyze_trace"] = run_analyze_trace(out / kept) if kept else None
    write()
    _print_table(bench, summary["checks"])
    log(f"wrote {sorted(p.name for p in out.iterdir())}" + (f"; FAILED: {failed}" if failed else ""))
    teardown()
    return 1 if failed else 0


if __name__ == "__main__":
    if "--simulate-cpu" in sys.argv:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the simulation must not touch a GPU, even where one exists
        # one intra-op thread: the tiny model gains nothing from more, and on a busy 2-core CI machine
        # two threads fighting other processes made the simulation 4x slower (75 s against 18 s, measured)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
