#!/usr/bin/env bash
# The whole GPU check in one prepared script, for a machine with an NVIDIA GPU.
# Used through the device tool as:  bash tools/device_gpu_check.sh   (with $OUT set by the tool)
# or by hand on any CUDA machine:   OUT=gpu_out bash tools/device_gpu_check.sh
# It uses the machine's own python3 with torch (no install, no network, no Jupyter packages:
# gpu-check runs the notebooks' code cells itself); course_utils is run from this checkout
# through PYTHONPATH. PYTHON=... picks another interpreter.
#
# It writes 6 files into $OUT (the device tool returns at most 8, at most 2 folders deep):
#   gpu_check_log.txt        everything every step printed, in full (this script's output)
#   lesson04_transfer.json   } the reference results: copy these three, and only these,
#   lesson05_augment.json    } into course_utils/reference_results/
#   gpu_check_summary.json   }
#   tune_cuda.json           tune's result on CUDA: for the issue note, NOT a reference file
#   diagnose_cuda.json       diagnose on the data-bound example on CUDA: for the note, NOT a reference
#
# Time: one device-tool call runs 600 s at most; python's start, torch's import and CUDA's
# start-up happen inside each step. Each step has its own timeout (-k 5: killed 5 s after
# it is told to stop); tests/test_gpu_check.py holds these rows to the script and their sum to
# 560 s at most, which leaves 40 s or more for the rest of the call.
#
#   step                                        seconds
#   memory: free -g                                   5
#   memory: df -h /dev/shm                            5
#   nvidia-smi                                       10
#   doctor                                       25 + 5
#   gpu-check (--budget 240; notebooks inside)  285 + 5
#   GPU unit tests                               80 + 5
#   tune on CUDA (--budget 30)                   60 + 5
#   one nccl rank (measure_ddp timeout_s 25)     35 + 5
#   diagnose on CUDA (--budget 15)               25 + 5
#   total                                           560
#
# Exit status: 0 only when every step passed; otherwise 1, and the log ends with the list of
# the steps that failed (gpu-check lists its own failed sections, cells and targets).
set -uo pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
LOG="$OUT/gpu_check_log.txt"
REFERENCE_FILES="lesson04_transfer.json lesson05_augment.json gpu_check_summary.json"
failed=()

step() {  # step NAME COMMAND...: run it, print its exit status and time, remember a failure
  local name=$1 t0=$SECONDS rc
  shift
  echo
  echo "== $name"
  "$@"
  rc=$?
  case $rc in
    0) echo "== $name: ok ($((SECONDS - t0)) s)" ;;
    124|137) echo "== $name: FAILED: TIMED OUT after $((SECONDS - t0)) s"; failed+=("$name (timed out)") ;;
    *) echo "== $name: FAILED with exit status $rc ($((SECONDS - t0)) s)"; failed+=("$name (exit $rc)") ;;
  esac
}

check() {
  echo "== GPU check on $(uname -n) at $(date -u '+%Y-%m-%d %H:%M:%S UTC'); python: $PY; log: $LOG"

  # memory first: lesson 05's loaders can hold about 5 GB in /dev/shm, tune's search a few GB
  echo "== memory"
  timeout 5 free -g || echo "free -g: failed (exit $?)"
  local shm_kb="" mem_kb shm_gb mem_gb tune_size=""
  if timeout 5 df -h /dev/shm; then   # it answered: ask again for a number to size from
    shm_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  else
    echo "df -h /dev/shm: failed (exit $?)"
  fi
  mem_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null)
  shm_gb=$(( ${shm_kb:-0} / 1048576 ))
  mem_gb=$(( ${mem_kb:-0} / 1048576 ))
  if [ "$shm_gb" -ge 8 ] && [ "$mem_gb" -ge 16 ]; then
    echo "sizes: ${shm_gb} GiB free in /dev/shm and ${mem_gb} GiB RAM available: full sizes" \
         "(tune: the course data at its default size; gpu-check says how lesson 04's sweep and" \
         "lesson 05's loaders fit)"
  else
    tune_size="--images 256 --batch-size 32"
    echo "sizes: only ${shm_gb} GiB free in /dev/shm / ${mem_gb} GiB RAM available (full sizes" \
         "want 8 and 16): tune runs with $tune_size (its loaders hold workers x prefetch x" \
         "batch images in /dev/shm); gpu-check warns if lesson 05's loaders may not fit"
  fi

  echo "== nvidia-smi"
  timeout 10 nvidia-smi || echo "nvidia-smi: not available or failed (exit $?)"

  step "doctor" timeout -k 5 25 "$PY" -m course_utils doctor

  # the reference results first: the rest of the run must not cost them
  step "gpu-check (lessons 04-05 full mode, then notebooks 04, 05, 08 quick mode)" \
    timeout -k 5 285 "$PY" -m course_authoring gpu-check --out "$OUT" --budget 240

  if "$PY" -c "import pytest" 2>/dev/null; then
    # -v: a test that runs out of time is named in the log
    step "GPU unit tests (CUDA paths of lessons 04-05)" \
      env COURSE_QUICK=1 timeout -k 5 80 "$PY" -m pytest -v -rfE -p no:cacheprovider \
      tests/test_transfer.py tests/test_augment.py tests/test_grader04.py tests/test_grader05.py
  else
    echo "== GPU unit tests: FAILED: pytest is not installed for $PY"
    failed+=("GPU unit tests (no pytest)")
  fi

  # shellcheck disable=SC2086  # $tune_size is empty or several words
  step "lesson 06: tune on CUDA (pin_memory is tried only there)" \
    timeout -k 5 60 "$PY" -m course_utils tune --budget 30 --no-progress $tune_size \
    --json "$OUT/tune_cuda.json"

  step "lesson 07: one rank under torchrun with nccl (one GPU per rank)" \
    timeout -k 5 35 "$PY" -c "from course_authoring.notebook_modules import notebook_module
from course_utils import usable_cpus
from course_utils.lessons.l07_launch import pick_backend
print('backend for 1 rank:', pick_backend(1))
ddp = notebook_module('07_scaling_out.ipynb', 'lesson07_ddp')  # the lesson's own measure_ddp
print(ddp.measure_ddp(1, num_workers=max(usable_cpus() - 1, 0), rank_threads=1, timeout_s=25))"

  step "lesson 08: diagnose on CUDA (the data-bound example's step runs on the GPU)" \
    timeout -k 5 25 "$PY" -m course_utils diagnose course_utils.examples.data_bound:make_loop \
    --budget 15 --no-progress --json "$OUT/diagnose_cuda.json"

  echo
  echo "== files in $OUT:"
  ls -l "$OUT"
  echo "== copy the reference results, and nothing else, into course_utils/reference_results/:"
  local f files=""
  for f in $REFERENCE_FILES; do files+=" $OUT/$f"; done
  echo "   cp$files course_utils/reference_results/"
  echo "   ($OUT/tune_cuda.json and $OUT/diagnose_cuda.json are for the issue note: not reference files)"
  if [ ${#failed[@]} -eq 0 ]; then
    echo "== done: every step passed (${SECONDS} s)"
    return 0
  fi
  echo "== done in ${SECONDS} s: ${#failed[@]} step(s) FAILED (see above, and read gpu-check's" \
       "failures before committing any reference file):"
  printf '   - %s\n' "${failed[@]}"
  return 1
}

check 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
