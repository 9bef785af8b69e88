#!/usr/bin/env bash
# The server on a CUDA machine that has torch, triton and transformers but no package index and
# no model download: `python -m course.final serve` on a random-weights Llama-3.2-1B-shape folder,
# a smoke test of the OpenAI API over plain HTTP, and a short bench_serving run.
#
#     bash final/gpu_serve_check.sh OUTDIR [serve] [engine]   (wheels from .whl/, or WHEELS=DIR)
#     DRY_RUN=1 PYTHON=venv/bin/python bash final/gpu_serve_check.sh OUTDIR   (the CPU, a tiny model)
#
# The wheels the server needs and that machine lacks (fastapi, starlette, uvicorn, pydantic,
# pydantic-core, annotated-types, typing-inspection, opentelemetry-api, which fastapi imports;
# typing-extensions for pydantic's lower bound) travel with the call, for the machine's Python 3.12,
# fetched once here into .whl/ (ignored by git; 3 MB):
#
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection \
#         typing-extensions opentelemetry-api
#
# (anyio, h11, click, annotated-doc, httpx, jinja2 and prometheus-client are there already.) Keep
# one version of each. The device call names .whl in `carry`:
#
#     run(command="bash final/gpu_serve_check.sh $OUT", carry=[".whl"], timeout_s=420)
#
# Each part runs under its own limit, about 5 minutes in all:
#
#   part     limit  what
#   model    90 s   the 1B-shape folder: random bfloat16 weights, the byte-level tokenizer (bench/gpu_serve.py model)
#   start    150 s  the server with its GPU defaults (bf16, Triton, graphs captured before the port opens)
#   smoke    60 s   health, chat, streamed, n=2, response_format json_schema  -> CARD_serve_smoke.json
#   bench    60 s   bench/serving.py's client, 64 requests at once, synthetic prompts -> CARD_serve_bench.json
#   stop     30 s   Ctrl-C: the server drains and exits
#
# and CARD_serve_log.txt (this script's output and the server's): three files. Named, `engine`
# also runs bench/gpu_engine.py (the engine in process, 1B and 8B shapes, per-step wall, device
# and host time; 300 s) into CARD_gpu_engine.json, for final/results/gpu_engine_CARD.json. CARD is the card's
# short name (h100, h200), "dry" in a dry run. The course goes on the path without pip, as
# stages/06_kernels_graphs/gpu_check.sh does.
set -u
DRY=${DRY_RUN:-0}
[ "$DRY" = 0 ] || DRY=1
OUT=${1:?usage: bash final/gpu_serve_check.sh OUTDIR}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
source stages/06_kernels_graphs/bench/device_parts.sh  # card_name, part
mkdir -p "$OUT"
TMP=$(mktemp -d)
SERVER=
cleanup() {
    [ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$TMP/pkg/course"
for d in stages/*/; do ln -s "$PWD/$d" "$TMP/pkg/course/s$(basename "$d")"; done
ln -s "$PWD/final" "$TMP/pkg/course/final"
export PYTHONPATH=$TMP/pkg PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then
    CARD=${CARD:-dry}
    SHAPE=tiny
    SERVE_ARGS=(--kv-blocks 256 --max-num-seqs 8)
    BENCH_ARGS=(--num-requests 8 --prompt-chars 64 --output-tokens 16)
else
    CARD=${CARD:-$(card_name)}
    SHAPE=1b
    SERVE_ARGS=(--max-num-seqs 64)
    BENCH_ARGS=(--num-requests 64 --prompt-chars 512 --output-tokens 128)
    # the carried wheels, installed into a folder of their own (nothing else on the machine changes)
    ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: see the pip download line above"; exit 2; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TMP/site" \
        "$WHEELS"/*.whl || exit 2
    export PYTHONPATH=$TMP/pkg:$TMP/site
fi
LOG="$OUT/${CARD}_serve_log.txt"
: >"$LOG"
[ "$DRY" = 1 ] && echo "# DRY RUN: the CPU, a tiny model; the figures mean nothing" | tee -a "$LOG"
[ "$DRY" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
$PY -c "import torch, fastapi, uvicorn, pydantic; print('torch', torch.__version__, 'fastapi', fastapi.__version__,
'uvicorn', uvicorn.__version__, 'pydantic', pydantic.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"

PARTS=${*:2}
PARTS=${PARTS:-serve}
START=$SECONDS
ok=0
case " $PARTS " in *" engine "*)
    echo "== engine" | tee -a "$LOG"
    dry=()
    [ "$DRY" = 1 ] && dry=(--dry-run)
    part 300 $PY -m course.final.bench.gpu_engine ${dry[@]+"${dry[@]}"} --json "$OUT/${CARD}_gpu_engine.json" || ok=1 ;;
esac
case " $PARTS " in *" serve "*) ;; *) exit $ok ;; esac

echo "== model ($((SECONDS - START)) s in)" | tee -a "$LOG"
part 90 $PY -m course.final.bench.gpu_serve model "$TMP/model" --shape $SHAPE || exit 1

echo "== start ($((SECONDS - START)) s in)" | tee -a "$LOG"
PORT=$($PY -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
URL=http://127.0.0.1:$PORT
$PY -m course.final serve --model "$TMP/model" --served-model-name random-1b --port "$PORT" "${SERVE_ARGS[@]}" \
    >"$TMP/server.log" 2>&1 &
SERVER=$!
part 150 $PY -m course.final.bench.gpu_serve wait "$URL" --timeout 140
ready=$?

smoke_rc=-1 bench_rc=-1
if [ "$ready" = 0 ]; then
    echo "== smoke ($((SECONDS - START)) s in)" | tee -a "$LOG"
    part 60 $PY -m course.final.bench.gpu_serve smoke "$URL" --json "$OUT/${CARD}_serve_smoke.json"
    smoke_rc=$?
    echo "== bench ($((SECONDS - START)) s in)" | tee -a "$LOG"
    part 60 $PY -m course.final.bench.gpu_serve bench "$URL" "${BENCH_ARGS[@]}" --json "$OUT/${CARD}_serve_bench.json"
    bench_rc=$?
fi

echo "== stop ($((SECONDS - START)) s in)" | tee -a "$LOG"
kill -INT "$SERVER" 2>/dev/null
for _ in $(seq 60); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
kill -0 "$SERVER" 2>/dev/null && echo "!! the server did not stop on Ctrl-C" | tee -a "$LOG"
wait "$SERVER" 2>/dev/null
server_rc=$?
SERVER=
{ echo "== the server's output"; cat "$TMP/server.log"; } >>"$LOG"
echo "== $((SECONDS - START)) s in all; ready $ready, smoke $smoke_rc, bench $bench_rc, server exit $server_rc" | tee -a "$LOG"
[ "$ok" = 0 ] && [ "$ready" = 0 ] && [ "$smoke_rc" = 0 ] && [ "$bench_rc" = 0 ]
