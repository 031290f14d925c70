#!/usr/bin/env bash
# The GPU check's CPU simulation on the GPU machine's own library versions (torch 2.11, transformers 5.17,
# accelerate 1.15: /work/.library/device/KINDS.md), with the first shape failing on purpose. Issue 34: the check
# must survive a failing shape and keep every other shape's results on the stack the first GPU session has.
#   bash scripts/device_stack_sim.sh [VENV]   # VENV defaults to .device-venv (git-ignored); about 3 GB
# PyPI offers torch 2.11 only as its CUDA build; it imports and runs on a CPU without a driver. Writes the
# results to data/results/gpu_check_sim/ and then runs the two tests of the simulation with that interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.device-venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[device-stack] creating $VENV with the GPU image's versions (several minutes: torch 2.11's CUDA wheels)"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet torch==2.11.0 transformers==5.17.0 accelerate==1.15.0 peft \
    safetensors pyyaml numpy pandas psutil tqdm
fi
OUT=data/results/gpu_check_sim
rm -rf "$OUT" && mkdir -p "$OUT"
FAIL=$(PYTHONPATH=src "$VENV/bin/python" -c \
  "from smolfsdp.audit.gpu_check.measure_gpu import FAIL_SHAPE_ENV as e, SIM_SHAPES as s; print(e + '=' + s[0].name)")
echo "[device-stack] running the simulation with $FAIL (a failure injected in the first shape)"
set +e
env "$FAIL" PYTHONPATH=src CUDA_VISIBLE_DEVICES= HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 \
  "$VENV/bin/python" scripts/gpu_check.py --simulate-cpu --out "$OUT" --warmup-steps 1 --timed-steps 1 \
  2>&1 | tee "$OUT/stdout.txt"
rc=${PIPESTATUS[0]}
set -e
echo "[device-stack] simulation exit $rc (1 is expected: one shape failed on purpose)"
SMOLFSDP_SIM_PYTHON="$PWD/$VENV/bin/python" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/test_gpu_first_session.py -k "failing_shape or gloo"
