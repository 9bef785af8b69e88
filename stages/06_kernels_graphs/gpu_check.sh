#!/usr/bin/env bash
# Stage 06 on a CUDA GPU, in one go: the GPU-only tests, the decode kernel's knobs swept, each
# kernel's bandwidth, and the decode step and end-to-end tok/s side by side (eager, Triton, CUDA
# graphs) on two random-weight shapes.
#
#     bash stages/06_kernels_graphs/gpu_check.sh OUTDIR [tests] [tune] [kernels] [step]   (default: all)
#
# Written for a lent machine that has torch, triton and transformers but no package registry and
# no model download: the course is put on the path without pip (course.sNN_name -> stages/NN_name),
# and the models are random weights in SmolLM2-135M's and Llama-3.2-1B's shapes (speed depends on
# the shapes, not the values; the default model's GPU test needs its weights and is left out).
# Each part has its own time limit, so one that hangs still leaves the others' results in OUTDIR.
# The README quotes these files from results/gpu/, named for the card (h100_kernels.json, ...).
set -u
OUT=${1:-/tmp/stage06_gpu}
mkdir -p "$OUT"
PKG=$(mktemp -d)
mkdir -p "$PKG/course"
for d in stages/*/; do ln -s "$PWD/$d" "$PKG/course/s$(basename "$d")"; done
ln -s "$PWD/final" "$PKG/course/final"
export PYTHONPATH=$PKG PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee "$OUT/log.txt"

PARTS=${*:2}
PARTS=${PARTS:-tests tune kernels step}
LOG="$OUT/log.txt"  # one text log and a JSON per part: the lent machine returns at most 8 files
for part in $PARTS; do
    echo "== $part" | tee -a "$LOG"
    case $part in
    tests) timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -k "not default_model" \
               stages/06_kernels_graphs/tests/test_gpu.py stages/01_decode_loop/tests/test_sampling.py ;;
    tune) timeout 150 python3 -m course.s06_kernels_graphs.bench.tune_decode --json "$OUT/tune_decode.json" ;;
    kernels) timeout 100 python3 -m course.s06_kernels_graphs.bench.bench_kernels --json "$OUT/kernels.json" ;;
    step) for model in 135m-random 1b-random; do
              timeout "$([ "$model" = 1b-random ] && echo 180 || echo 120)" python3 -m course.s06_kernels_graphs.bench.benchmark \
                  --model "$model" --batches 1 4 16 64 --json "$OUT/step_$model.json"
          done ;;
    esac 2>&1 | tee -a "$LOG"
done
