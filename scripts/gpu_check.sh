#!/usr/bin/env bash
# GPU check for the chapter "Reading the profiler" (issue 6), for a session that is lent one GPU.
# SmolLM3-3B geometry (data/models/smollm3_3b/config.json) with random weights (no download), one
# GPU, bf16 (FSDP2 MixedPrecisionPolicy), FULL_SHARD at world size 1, 20 benchmark steps at sequence
# lengths 2048 and 4096 (synthetic full-length batches: every token is a non-padding token):
# tokens/s, MFU, peak memory beside smolfsdp.memory's estimate, and a CUDA trace analysed.
# Results: data/results/<gpu>/seq<T>/{bench.json,trace_summary.json} + provenance.json.
#
#     bash scripts/gpu_check.sh            # about 5 minutes on an H200
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible')"
STEPS=${STEPS:-20}
WORKER=$(mktemp --suffix .py)
trap 'rm -f "$WORKER"' EXIT
cat > "$WORKER" <<'PYEOF'
import json, sys, time, datetime, platform
from pathlib import Path
import torch
from smolfsdp import benchmark, trace_analysis as ta
from smolfsdp.distributed import init_distributed, teardown
from smolfsdp.fsdp2 import apply_fsdp2, build_mesh, default_mp_policy
from smolfsdp.modeling import resolve_wrap_class
from smolfsdp.results import git_sha, versions
from transformers import AutoConfig, AutoModelForCausalLM

T, steps = int(sys.argv[1]), int(sys.argv[2])
info = init_distributed()
gpu = torch.cuda.get_device_name(0)
out = Path("data/results") / gpu.split()[-1].lower() / f"seq{T}"
out.mkdir(parents=True, exist_ok=True)
config = AutoConfig.from_pretrained("data/models/smollm3_3b")
torch.manual_seed(0)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
model.train()
n_params = benchmark.matmul_params(model)
apply_fsdp2(model, build_mesh("cuda", 1), resolve_wrap_class(model), mp_policy=default_mp_policy("bf16"))
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
ids = torch.randint(0, config.vocab_size, (1, T), device="cuda")
peak, reason = benchmark.peak_tflops(gpu)
fpt = benchmark.flops_per_token(n_params, seq_len=T, **benchmark.model_geometry(model))
trace_dir = out / "trace"
trace_dir.mkdir(exist_ok=True)
prof = torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
    schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
    on_trace_ready=lambda p: p.export_chrome_trace(str(trace_dir / "rank0.json.gz")),
)
rows = []
prof.start()
for step in range(1, steps + 2):  # step 1 is warm-up
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.record_function("forward_backward"):
        model(input_ids=ids, labels=ids).loss.backward()
    with torch.profiler.record_function("clip"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with torch.profiler.record_function("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    prof.step()
    rows.append({"step": step, "warmup": step == 1, "step_time_ms": ms, "tokens": T, "samples": 1,
                 "seq_len": T, "flops_per_token": fpt, **benchmark.step_metrics(ms, T, 1, fpt, 1, peak),
                 "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
                 "max_memory_reserved_bytes": torch.cuda.max_memory_reserved()})
prof.stop()
try:
    from smolfsdp.memory import estimate_memory
    est = estimate_memory("smollm3-3b", world_size=1, strategy="FULL_SHARD", seq_len=T, micro_batch=1)
    estimate = est.to_dict()
except Exception as err:  # report, do not hide: the chapter shows the error beside the measurement
    estimate = {"error": f"{type(err).__name__}: {err}"}
bench = {"name": f"gpu_check_seq{T}", "engine": "bare FSDP2 loop (scripts/gpu_check.sh)", "fsdp_version": 2,
         "world_size": 1, "device": "cuda", "device_name": gpu, "peak_tflops": peak, "mfu_reason": reason,
         "tokens_counted": "all T tokens of one synthetic full-length sequence", "n_params": n_params,
         "steps": rows, "summary": benchmark.summarise(rows), "memory_estimate": estimate}
(out / "bench.json").write_text(json.dumps(bench, indent=2, default=str))
(out / "trace_summary.json").write_text(json.dumps(ta.summarize_trace(trace_dir / "rank0.json.gz"), default=str))
(out.parent / "provenance.json").write_text(json.dumps({
    "gpu": gpu, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "git_sha": git_sha(),
    "versions": versions(), "platform": platform.platform(), "script": "scripts/gpu_check.sh",
    "cuda": torch.version.cuda, "weights": "random (SmolLM3-3B geometry from data/models/smollm3_3b/config.json)",
}, indent=2))
print(json.dumps(bench["summary"], indent=2))
teardown()
PYEOF
for T in 2048 4096; do
  timeout 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node=1 "$WORKER" "$T" "$STEPS"
done
