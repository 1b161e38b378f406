#!/usr/bin/env bash
# The whole GPU check in one prepared script, for a machine with an NVIDIA GPU.
# Used through the device tool as:  bash tools/device_gpu_check.sh   (with $OUT set by the tool)
# or by hand on any CUDA machine:   OUT=gpu_out bash tools/device_gpu_check.sh
# It uses the machine's own python3 with torch (no install, no network): course_utils is run
# from this checkout through PYTHONPATH. Budget: under 560 s in all, so that it fits in one
# device-tool call (600 s at most); every step has its own timeout.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0

echo "== doctor"
"$PY" -m course_utils doctor | tee "$OUT/doctor.txt"

echo "== GPU unit tests (CUDA paths of lessons 04-05), 100 s at most"
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout 100 "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/test_transfer.py tests/test_augment.py tests/test_grader04.py tests/test_grader05.py \
    2>&1 | tail -n 40 | tee "$OUT/gpu_tests.txt" || status=1
else
  echo "pytest is not installed here: unit tests skipped" | tee "$OUT/gpu_tests.txt"
fi

echo "== lesson 06: tune on CUDA (pin_memory is tried only there), 30 s budget"
timeout 75 "$PY" -m course_utils tune --budget 30 --no-progress --json "$OUT/tune_cuda.json" \
  2>&1 | tail -n 40 | tee "$OUT/tune_cuda.txt" || status=1

echo "== lesson 07: one rank under torchrun with nccl (one GPU per rank), 60 s at most"
timeout 60 "$PY" -c "from course_utils import measure_ddp
from course_utils.distributed import pick_backend
print('backend for 1 rank:', pick_backend(1))
print(measure_ddp(1, timeout_s=50, progress=False))" 2>&1 | tail -n 30 | tee "$OUT/ddp_nccl.txt" || status=1

echo "== gpu-check (full mode, writes reference results)"
timeout 320 "$PY" -m course_utils gpu-check --out "$OUT" --budget 250 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || status=$rc
echo "== done (status $status); copy $OUT/*.json into course_utils/reference_results/ and commit"
exit $status
