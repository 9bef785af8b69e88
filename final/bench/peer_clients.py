"""vLLM's benchmark client as bench/peers.py runs it: vllm_client.py with the python of vLLM's
venv, on the ShareGPT file this module writes, its result JSON read back. It runs with
`python -I`: a script's own folder goes first on the module search path, and this folder's
profile.py would shadow the standard library's."""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from course.s01_decode_loop.bench.workloads import load_conversations

HERE = Path(__file__).parent


def sharegpt_file(directory: str) -> str:
    """The complete ShareGPT records as vLLM's loader reads them ([{"conversations": [...]}]):
    the packaged file is truncated, which `json.load` refuses."""
    path = Path(directory) / "sharegpt_complete.json"
    if not path.is_file():
        path.write_text(json.dumps([{"conversations": c} for c in load_conversations()], ensure_ascii=False))
    return str(path)


def vllm_client(python: str, url: str, model: str, tokenizer: str, dataset: str, num_prompts: int,
                timeout_s: float = 3600) -> dict:
    """One run of vLLM's benchmark client (standard ShareGPT settings) against `url`: its result
    JSON, with the fields bench/peers.py reports."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run([python, "-I", str(HERE / "vllm_client.py"), "--base-url", url, "--model", model,
                               "--tokenizer", tokenizer, "--dataset-path", dataset, "--result-file", str(out),
                               "--num-prompts", str(num_prompts)],
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode or not out.is_file():
            raise RuntimeError(f"vLLM's client failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        r = json.loads(out.read_text())
    return {"standard_output_tok_s": r["output_throughput"], "standard_total_tok_s": r["total_token_throughput"],
            "standard_ttft_p50_s": r["median_ttft_ms"] / 1e3, "standard_tpot_p50_s": r["median_tpot_ms"] / 1e3,
            "standard_seconds": r["duration"], "standard_failed": r.get("failed", 0),
            "standard_prompt_tokens": r["total_input_tokens"]}
