#!/usr/bin/env bash
# The whole GPU check in one prepared script, for a machine with an NVIDIA GPU.
# Used through the device tool as:  bash tools/device_gpu_check.sh   (with $OUT set by the tool)
# or by hand on any CUDA machine:   OUT=gpu_out bash tools/device_gpu_check.sh
# It uses the machine's own python3 with torch (no install, no network): course_utils is run
# from this checkout through PYTHONPATH. Budget: about 9 minutes in all.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0

echo "== doctor"
"$PY" -m course_utils doctor | tee "$OUT/doctor.txt"

echo "== GPU unit tests (CUDA paths of lessons 04-05), 120 s at most"
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout 120 "$PY" -m pytest -q -x -p no:cacheprovider \
    tests/test_transfer.py tests/test_augment.py tests/test_grader04.py tests/test_grader05.py \
    2>&1 | tail -n 40 | tee "$OUT/gpu_tests.txt" || status=1
else
  echo "pytest is not installed here: unit tests skipped" | tee "$OUT/gpu_tests.txt"
fi

echo "== gpu-check (full mode, writes reference results)"
timeout 560 "$PY" -m course_utils gpu-check --out "$OUT" --budget 420 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || status=$rc
echo "== done (status $status); copy $OUT/*.json into course_utils/reference_results/ and commit"
exit $status
