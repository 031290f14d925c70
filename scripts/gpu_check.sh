#!/usr/bin/env bash
# GPU check (issue 13): SmolLM3-3B geometry (data/models/smollm3_3b/config.json, random weights) on
# one GPU, one process (world size 1, no torchrun), FSDP2 with bf16 compute, fused AdamW: seq 2048
# and 4096 at micro-batch 1, and the real run's shape (micro-batch 2 x 2048, activation
# checkpointing); 3 warm-up + 10 timed steps each (CUDA events), then a profiled window; a bf16
# matmul timed in the same run as the measured ceiling. About 3 minutes on an H200.
#
#     OUT=/path/to/empty/dir bash scripts/gpu_check.sh                 # on the lent GPU machine
#     OUT=/tmp/sim bash scripts/gpu_check.sh --simulate-cpu            # the same path on CPU (tests)
#
# Writes flat into $OUT (at most 8 files, the device tool's limit): bench.json, trace_summary.json,
# provenance.json, trace_<shape>.json.gz (< 16 MiB), gpu_check.log, nvidia_smi.txt and, on a GPU,
# nvidia_smi_during.csv (clocks, power, memory every second while the check runs). Commit them to
# data/results/h200/ (see its README). The profiler's raw working traces go to a temporary folder
# outside $OUT (removed on exit and on timeout's SIGTERM). SMOLFSDP_GIT_SHA=<sha> records the commit
# where the copy of the checkout has no .git. PY overrides the interpreter (default python3: the GPU
# machine's).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the results (the device tool sets it)}"
PY=${PY:-python3}
command -v "$PY" >/dev/null || { echo "gpu_check: no $PY on PATH; set PY to a Python with torch" >&2; exit 2; }
[ -d src/smolfsdp ] || { echo "gpu_check: src/smolfsdp not found under $PWD" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
LOG="$OUT/gpu_check.log"
SIM=0
for a in "$@"; do [ "$a" = --simulate-cpu ] && SIM=1; done

smi() {  # one nvidia-smi reading into nvidia_smi.txt, or a line saying why there is none
  if [ "$SIM" = 1 ] || ! command -v nvidia-smi >/dev/null; then
    echo "[$1] nvidia-smi not run ($([ "$SIM" = 1 ] && echo 'CPU simulation' || echo 'not on PATH'))" >>"$OUT/nvidia_smi.txt"
    return 0
  fi
  { echo "[$1] $(date -u +%FT%TZ)"; nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE; } >>"$OUT/nvidia_smi.txt" 2>&1 || true
}

smi before
SAMPLER=""
if [ "$SIM" = 0 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used \
    --format=csv -l 1 >"$OUT/nvidia_smi_during.csv" 2>&1 &
  SAMPLER=$!
fi
set +e
# the whole check stops after GPU_CHECK_TIMEOUT_S (7.5 min), inside the device tool's limit; the
# files written after each shape, the log and the nvidia-smi readings still come back
timeout "${GPU_CHECK_TIMEOUT_S:-450}" "$PY" scripts/gpu_check.py --out "$OUT" \
  --command "bash scripts/gpu_check.sh $*" "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
smi after
echo "gpu_check: exit $rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$LOG"
exit "$rc"
