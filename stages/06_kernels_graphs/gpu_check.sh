#!/usr/bin/env bash
# Stage 06 on a CUDA GPU, in one go: every GPU goal of the stage measured, the ceilings each is
# judged against measured in the same call, the lesson's kernels and the gpu/ room's side by
# side, and the goals table printed last. The parts' limits add up to 570 s, inside the 10
# minutes a lent machine gives one command.
#
#     bash stages/06_kernels_graphs/gpu_check.sh OUTDIR [PART ...]     (default: tests ceilings attention steps moe summary)
#     bash stages/06_kernels_graphs/gpu_check.sh --dry-run OUTDIR      (or DRY_RUN=1: the CPU, tiny shapes, 1-2 minutes)
#
# Each part runs under its own time limit, so one that hangs leaves the others' results. What
# each writes into OUTDIR, CARD being the card's short name (h100, h200; "dry" in a dry run):
#
#   part       limit  writes                 what
#   tests      90+45  CARD_tests.json        the GPU tests (-m gpu: kernels equal their references, graph
#                                            replay equals eager) and the sm_90 compile report's test; exit codes
#   ceilings   45 s   CARD_ceilings.json     copy and read bandwidth, bf16 GEMM (bench/ceilings.py)
#   attention  90+90  CARD_decode.json       paged decode, lesson vs room (bench/bench_attention.py --parts decode)
#                     CARD_prefill.json      varlen prefill, lesson vs room vs SDPA (... --parts prefill)
#   steps      150 s  CARD_mixed_step.json   mixed and verification steps vs a decode step, 1B shape (bench/mixed_step.py)
#   moe        30 s   CARD_moe.json          a Qwen3-30B-A3B MoE layer at batch 1-16: fused kernel vs the per-expert
#                                            loop vs its chosen experts' bytes at read bandwidth (bench/bench_moe.py)
#   summary    30 s   CARD_summary.json      the goals table from the files above (bench/gpu_summary.py)
#
# and CARD_log.txt, everything printed: eight files (the lent machine returns at most eight). The
# lesson's own sweeps run only when named: tune (150 s), kernels (100 s), step (300 s, two files).
# The README quotes these files from results/gpu/, where they are copied as written.
#
# Written for a lent machine that has torch, triton and transformers but no package registry and
# no model download: the course is put on the path without pip (course.sNN_name -> stages/NN_name),
# and the model is random weights in Llama-3.2-1B's shape (speed depends on the shapes, not the
# values). The dry run runs every part on the CPU at tiny shapes, Triton through its interpreter:
# it proves the plumbing, its figures mean nothing. PYTHON picks the interpreter (default python3).
set -u
DRY=${DRY_RUN:-0}
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
[ "$DRY" = 0 ] || DRY=1
OUT=${1:-/tmp/stage06_gpu}
PY=${PYTHON:-python3}
source stages/06_kernels_graphs/bench/device_parts.sh  # card_name, part
mkdir -p "$OUT"
PKG=$(mktemp -d)
trap 'rm -rf "$PKG"' EXIT
mkdir -p "$PKG/course"
for d in stages/*/; do ln -s "$PWD/$d" "$PKG/course/s$(basename "$d")"; done
ln -s "$PWD/final" "$PKG/course/final"
export PYTHONPATH=$PKG PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then
    CARD=${CARD:-dry}
    FLAG=--dry-run
else
    CARD=${CARD:-$(card_name)}
    FLAG=
fi
LOG="$OUT/${CARD}_log.txt"
: >"$LOG"
if [ "$DRY" = 1 ]; then
    echo "# DRY RUN: the CPU, tiny shapes, Triton's interpreter; the figures mean nothing" | tee -a "$LOG"
else
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
fi
$PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$LOG"

PARTS=${*:2}
PARTS=${PARTS:-tests ceilings attention steps moe summary}
START=$SECONDS
for name in $PARTS; do
    echo "== $name ($((SECONDS - START)) s in)" | tee -a "$LOG"
    case $name in
    tests)
        paths=()  # those that exist: one missing path would stop pytest before any test ran
        for p in stages/06_kernels_graphs/tests/test_gpu.py stages/06_kernels_graphs/gpu/tests \
                 stages/06_kernels_graphs/mixed_graphs/tests stages/01_decode_loop/tests/test_sampling.py; do [ -e "$p" ] && paths+=("$p"); done
        part 90 $PY -m pytest -q -m gpu -p no:cacheprovider -k "not default_model" "${paths[@]}"
        gpu_rc=$?
        part 45 $PY -m pytest -q -p no:cacheprovider stages/06_kernels_graphs/gpu/tests/test_compile_report.py
        report_rc=$?
        printf '{"command": "bash stages/06_kernels_graphs/gpu_check.sh%s OUTDIR tests", "dry_run": %s, "gpu_tests_rc": %d, "compile_report_rc": %d}\n' \
            "${FLAG:+ $FLAG}" "$([ "$DRY" = 1 ] && echo true || echo false)" "$gpu_rc" "$report_rc" >"$OUT/${CARD}_tests.json" ;;
    ceilings)
        part 45 $PY -m course.s06_kernels_graphs.bench.ceilings $FLAG --json "$OUT/${CARD}_ceilings.json" ;;
    attention)
        ceilings=()
        [ -f "$OUT/${CARD}_ceilings.json" ] && ceilings=(--ceilings "$OUT/${CARD}_ceilings.json")
        for kind in decode prefill; do  # two runs, two files: one that hits its limit keeps the other's
            part 90 $PY -m course.s06_kernels_graphs.bench.bench_attention $FLAG --parts $kind \
                ${ceilings[@]+"${ceilings[@]}"} --json "$OUT/${CARD}_$kind.json"
        done ;;
    steps)
        part 150 $PY -m course.s06_kernels_graphs.bench.mixed_step $FLAG --json "$OUT/${CARD}_mixed_step.json" ;;
    moe)
        part 30 $PY -m course.s06_kernels_graphs.bench.bench_moe $FLAG --json "$OUT/${CARD}_moe.json" ;;
    summary) ;;  # always last, below
    tune)
        part 150 $PY -m course.s06_kernels_graphs.bench.tune_decode --json "$OUT/${CARD}_tune_decode.json" ;;
    kernels)
        part 100 $PY -m course.s06_kernels_graphs.bench.bench_kernels --json "$OUT/${CARD}_kernels.json" ;;
    step)
        for model in 135m-random 1b-random; do
            part "$([ "$model" = 1b-random ] && echo 180 || echo 120)" $PY -m course.s06_kernels_graphs.bench.benchmark \
                --model "$model" --batches 1 4 16 64 --json "$OUT/${CARD}_step_$model.json"
        done ;;
    *) echo "unknown part $name" | tee -a "$LOG" ;;
    esac
done

files=$(find "$OUT" -type f | wc -l)
case " $PARTS " in *" summary "*) files=$((files + 1)) ;; esac  # the summary's file, to come
echo "== $((SECONDS - START)) s in all; $files files in $OUT$([ "$files" -gt 8 ] && echo ' (MORE THAN THE 8 A LENT MACHINE RETURNS)')" | tee -a "$LOG"
case " $PARTS " in
*" summary "*) part 30 $PY -m course.s06_kernels_graphs.bench.gpu_summary "$OUT" --card "$CARD" \
                   --json "$OUT/${CARD}_summary.json" ;;
esac
