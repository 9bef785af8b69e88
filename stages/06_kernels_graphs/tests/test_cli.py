"""Stage 06's CLI: stage 04's contract; every backend and graph setting gives stage 04's tokens."""
import json
import subprocess
import sys

import pytest
import torch

ARGS = ["--prompt", "first prompt", "--prompt", "a second, longer prompt", "--max-new-tokens", "4", "--ignore-eos",
        "--json", "--block-size", "4"]


def cli(stage, tiny_folder, *extra):
    proc = subprocess.run([sys.executable, "-m", stage, "--model", str(tiny_folder), *ARGS, *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line)["token_ids"] for line in proc.stdout.splitlines()], proc.stderr


@pytest.fixture(scope="module")
def stage04_tokens(tiny_folder):
    return cli("course.s04_continuous_batching", tiny_folder)[0]


@pytest.mark.parametrize("flags", [[], ["--cuda-graphs", "--fused"], ["--backend", "triton", "--cuda-graphs"]],
                         ids=["torch", "torch-graphs-fused", "triton-graphs"])
def test_cli_gives_stage04_tokens(tiny_folder, stage04_tokens, flags):
    want = stage04_tokens
    got, stderr = cli("course.s06_kernels_graphs", tiny_folder, *flags)
    assert got == want
    if "--cuda-graphs" in flags:
        assert "'graphed_steps': 0" not in stderr and "graphed_steps" in stderr
    if "triton" in flags and not torch.cuda.is_available():  # on a CPU it names the stand-ins it runs
        assert "interpreter" in stderr and "stand-in" in stderr
