"""The server on a machine with no package index and no model download: the Python half of
`final/gpu_serve_check.sh` (read that first), one sub-command per part.

    python -m course.final.bench.gpu_serve model DIR [--shape 1b|tiny]    # a random-weights HF folder
    python -m course.final.bench.gpu_serve wait URL [--timeout 150]       # until /health answers
    python -m course.final.bench.gpu_serve smoke URL [--json PATH]        # the OpenAI API, checked
    python -m course.final.bench.gpu_serve bench URL [--json PATH]        # a short bench_serving run

`model` writes config.json (transformers' LlamaConfig in Llama-3.2-1B's shape, or a tiny one),
model.safetensors with random weights, and the byte-level tokenizer with a chat template; the
ids past its 258 tokens decode to nothing, as a real vocabulary's unused ids would.
`smoke` speaks plain HTTP through urllib (the GPU machine has no openai package): health and
the model card, a chat completion, the same request streamed (the same text, one usage), n=2
(two seeded choices), and response_format json_schema (the answer parses and has the schema's
keys). Each check is kept with its result; the exit status says whether all passed.
`bench` runs bench/serving.py's client (Poisson arrivals, streaming, TTFT/TPOT/ITL) on synthetic
prompts: ShareGPT would need a download.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from course.s01_decode_loop.bench.measure import write_json

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["a", "b", "c"]}},
          "required": ["ok", "n", "tag"]}


def write_model(folder: str | Path, shape: str = "1b", seed: int = 0) -> Path:
    """A loadable HF folder: random weights (bfloat16 for the 1B shape), the byte tokenizer."""
    import torch
    from transformers import LlamaConfig

    from course.s01_decode_loop.config import ModelConfig
    from course.s01_decode_loop.testing import byte_tokenizer, save_hf_folder

    from ..testing import CHAT_TEMPLATE
    from .gpu_engine import llama_config, random_model

    if shape == "1b":
        hf = llama_config("1b")
    else:  # a few hundred ids past the tokenizer's 258, as the 1B shape has thousands
        hf = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    hf.bos_token_id, hf.eos_token_id = 256, 257  # the byte tokenizer's <s> and </s>
    model = random_model(ModelConfig.from_hf(hf), "cpu", torch.bfloat16 if shape == "1b" else torch.float32, seed)
    tok = byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    save_hf_folder(model, tok, folder)
    return Path(folder)


def wait_ready(url: str, timeout: float) -> float:
    """Seconds until GET /health answers 200 (graphs are captured before the port opens)."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - start
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url}/health did not answer within {timeout:.0f} s")


def post(url: str, body: dict, timeout: float = 60) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def stream(url: str, body: dict, timeout: float = 60) -> list[dict]:
    """Every `data:` event of an SSE response up to [DONE], parsed."""
    req = urllib.request.Request(url, json.dumps(body | {"stream": True}).encode(),
                                 {"content-type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                return events
            events.append(json.loads(data))
    raise AssertionError("the stream ended without [DONE]")


def smoke_checks(url: str, max_tokens: int = 16) -> list[tuple[str, callable]]:
    chat = url + "/v1/chat/completions"
    base = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}

    def health():
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200, r.status
        card = get(url + "/v1/models")["data"][0]
        assert card["max_model_len"] > 0, card
        return f"model {card['id']}, max_model_len {card['max_model_len']}"

    def whole():
        out = post(chat, base)
        assert out["object"] == "chat.completion" and len(out["choices"]) == 1, out
        assert out["choices"][0]["finish_reason"] == "length", out["choices"][0]
        assert out["usage"]["completion_tokens"] == max_tokens, out["usage"]
        assert isinstance(out["choices"][0]["message"]["content"], str)
        return out

    def streamed():
        events = stream(chat, base | {"stream_options": {"include_usage": True}})
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        usage = [e["usage"] for e in events if e.get("usage")]
        assert usage and usage[-1]["completion_tokens"] == max_tokens, usage
        assert text == whole()["choices"][0]["message"]["content"], "the stream's text differs from the whole answer's"
        return f"{len(events)} events, usage {usage[-1]}"

    def two_choices():
        out = post(chat, base | {"n": 2, "temperature": 1.0, "seed": 7})
        assert sorted(c["index"] for c in out["choices"]) == [0, 1], out["choices"]
        assert out["usage"]["completion_tokens"] == 2 * max_tokens, out["usage"]
        again = post(chat, base | {"n": 2, "temperature": 1.0, "seed": 7})
        texts = [c["message"]["content"] for c in out["choices"]]
        assert texts == [c["message"]["content"] for c in again["choices"]], "seeded choices are not reproducible"
        return f"{len(out['choices'])} choices"

    def json_schema():
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
        body = {"messages": base["messages"], "max_tokens": 60, "temperature": 0, "response_format": fmt}
        content = post(chat, body, timeout=120)["choices"][0]["message"]["content"]
        value = json.loads(content)
        assert set(SCHEMA["required"]) <= set(value) and value["tag"] in ("a", "b", "c"), value
        return content

    return [("health and model card", health), ("chat", lambda: whole()["usage"]), ("chat, streamed", streamed),
            ("n=2, seeded", two_choices), ("response_format json_schema", json_schema)]


def smoke(url: str) -> dict:
    """Each check run and kept with its result, its detail and its time."""
    checks = []
    for name, check in smoke_checks(url):
        start = time.perf_counter()
        try:
            detail, ok = check(), True
        except Exception as e:  # noqa: BLE001 - a failed check is a result, the next ones still run
            detail, ok = f"{type(e).__name__}: {e}", False
        checks.append({"check": name, "ok": ok, "seconds": time.perf_counter() - start, "detail": str(detail)[:300]})
        print(f"{'ok  ' if ok else 'FAIL'} {name:30s} {checks[-1]['seconds']:6.2f} s  {checks[-1]['detail'][:100]}")
    return {"url": url, "passed": all(c["ok"] for c in checks), "checks": checks}


def synthetic_requests(n: int, prompt_chars: int, output_tokens: int, seed: int = 0) -> list[tuple[str, int]]:
    """Printable prompts (one byte-level token per character): ShareGPT would need a download."""
    rng = random.Random(seed)
    words = ["the", "engine", "serves", "a", "batch", "of", "tokens", "on", "one", "card", "while", "it", "waits"]
    prompts = []
    for _ in range(n):
        text = ""
        while len(text) < prompt_chars:
            text += rng.choice(words) + " "
        prompts.append((text[:prompt_chars], output_tokens))
    return prompts


def bench(url: str, num_requests: int, rate: float, prompt_chars: int, output_tokens: int) -> dict:
    from .serving import print_summary, run

    result = asyncio.run(run(url, synthetic_requests(num_requests, prompt_chars, output_tokens), rate))
    result["summary"] |= {"num_requests": num_requests, "prompt_chars": prompt_chars,
                          "output_tokens_each": output_tokens}
    print_summary(result["summary"])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.final.bench.gpu_serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    m = sub.add_parser("model", help="write a random-weights HF folder")
    m.add_argument("folder")
    m.add_argument("--shape", choices=["1b", "tiny"], default="1b")
    for name in ("wait", "smoke", "bench"):
        s = sub.add_parser(name)
        s.add_argument("url")
        s.add_argument("--json", metavar="PATH")
    w = sub.choices["wait"]
    w.add_argument("--timeout", type=float, default=150)
    b = sub.choices["bench"]
    b.add_argument("--num-requests", type=int, default=64)
    b.add_argument("--request-rate", type=float, default=float("inf"))
    b.add_argument("--prompt-chars", type=int, default=512)
    b.add_argument("--output-tokens", type=int, default=128)
    args = p.parse_args(argv)
    if args.part == "model":
        start = time.perf_counter()
        print(f"wrote {write_model(args.folder, args.shape)} in {time.perf_counter() - start:.1f} s")
        return 0
    url = args.url.rstrip("/")
    if args.part == "wait":
        print(f"{url} ready after {wait_ready(url, args.timeout):.1f} s")
        return 0
    result = smoke(url) if args.part == "smoke" else bench(url, args.num_requests, args.request_rate,
                                                           args.prompt_chars, args.output_tokens)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    passed = result["passed"] if args.part == "smoke" else not result["summary"]["failed"]
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
