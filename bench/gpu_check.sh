#!/usr/bin/env bash
# ChatTTS on a lent GPU (unchanged on the CPU): builds the full-size random-weight model on cuda:0 when
# CUDA is present (else the CPU) and prints time to first chunk (ours vs upstream), real-time factor and
# batch scaling in one short run (< 5 min on a GPU), then (on a GPU) the closed-loop streaming load.
#
#   bench/gpu_check.sh            # full-size model
#   bench/gpu_check.sh --small    # tiny model, 1 s utterances: the CPU test run (tests/chattts)
#
# Needs the chattts extra: scripts/install_chattts.sh (on a CUDA machine install a CUDA torch instead of
# the pinned CPU build). PYTHON overrides the interpreter (default .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
"$PY" bench/chattts_gpu_check.py "$@"
# Closed-loop streaming load, windowed and continuous, where there is a GPU (full-size model only):
# the rooms one GPU holds at C100 = 100 % (bench/streaming_load.py, docs/benchmarks.md). About 4 min.
if [[ " $* " != *" --small "* ]] && "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  "$PY" bench/streaming_load.py --device cuda:0 --rooms 1,2,4,8,16,32,64 --max-batch 64 --seconds 8 --drain-s 30
fi
