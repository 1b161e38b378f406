#!/usr/bin/env bash
# The whole GPU check in one prepared command, for a machine with an NVIDIA GPU.
# Through the device tool:        bash tools/device_gpu_check.sh          ($OUT is set by the tool)
# By hand on any CUDA machine:    OUT=gpu_out bash tools/device_gpu_check.sh
# Rehearsal on this CPU (CI too): OUT=/tmp/rehearsal bash tools/device_gpu_check.sh --rehearse
#
# It uses the machine's own python3 with torch (no install, no network, no Jupyter: notebooks
# run without a kernel); course_utils comes from this checkout through PYTHONPATH; PYTHON=...
# picks another interpreter. Everything else is `python -m course_authoring gpu-check`
# (course_authoring/gpu_check.py): first a preflight line (Python, torch, torchvision, CUDA,
# cuDNN, NCCL, the compilers torch.compile needs, each GPU's compute and persistence mode,
# /dev/shm), then independent steps, each with its own timeout, at most 420 s in all counting
# every kill escalation (tests/test_gpu_check.py holds that), every process a step leaves
# behind killed, and the output ends with a summary of every step and failure (the preflight
# again), which fits in the device tool's last 12,000 characters. `... gpu-check --plan` prints
# the steps, their timeouts and each one's worst case.
#
# It writes 6 files into $OUT (the device tool returns at most 8):
#   gpu_check_log.txt        everything every step printed, in full
#   lesson04_transfer.json   } the reference results: the summary says to copy these three,
#   lesson05_augment.json    } and only these, into course_utils/reference_results/
#   gpu_check_summary.json   } (never after a rehearsal: its files are marked as one; it holds
#                              the preflight too)
#   tune_cuda.json           tune's result: for the issue note, NOT a reference file
#   diagnose_cuda.json       diagnose on the data-bound example: for the note, NOT a reference
#
# Exit status: 0 only when every step passed; otherwise 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
exec "${PYTHON:-python3}" -m course_authoring gpu-check --out "$OUT" --log "$OUT/gpu_check_log.txt" "$@"
