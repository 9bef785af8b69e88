"""Stage 07's command line with --tensor-parallel-size: the prompts through a two-process engine
print what the TP=1 engine generates; combinations it cannot run are refused before any rank starts."""
import json
import subprocess
import sys

import pytest

from course.s01_decode_loop.sampling import SamplingParams
from course.s07_disaggregated.cli import main
from course.s07_disaggregated.launcher import free_port
from course.s07_disaggregated.tensor_parallel.testing import reference_engine, save_tp_tiny

PROMPTS = ["Hello", "The quick brown fox jumps"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    return save_tp_tiny(byte_tok, tmp_path_factory.mktemp("tp_cli"))


def cli_args(folder) -> list[str]:
    return ["--model", str(folder), "--tensor-parallel-size", "2", "--max-new-tokens", "10", "--json",
            "--kv-blocks", "64", "--block-size", "4", *[a for p in PROMPTS for a in ("--prompt", p)]]


def tp1_tokens(folder, byte_tok) -> list[list[int]]:
    return [o.token_ids for o in reference_engine(folder, num_blocks=64, block_size=4).generate(
        [byte_tok.encode(p) for p in PROMPTS], SamplingParams(max_new_tokens=10, temperature=0))]


def token_rows(out: str) -> list[list[int]]:
    return [json.loads(line)["token_ids"] for line in out.splitlines() if line.startswith("{")]


def test_cli_prompts_through_tp2_print_the_tp1_tokens(folder, byte_tok, capsys):
    assert main(cli_args(folder)) == 0
    assert token_rows(capsys.readouterr().out) == tp1_tokens(folder, byte_tok)


def test_cli_under_torchrun_takes_the_same_path(folder, byte_tok):
    """torchrun starts both ranks; rank 0 prints, rank 1 follows, both exit."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "-m", "course.s07_disaggregated", *cli_args(folder)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert token_rows(done.stdout) == tp1_tokens(folder, byte_tok)


@pytest.mark.parametrize("flags,message", [
    (["--replicas", "2"], "does not combine with --prefill/--decode/--replicas"),
    (["--tensor-parallel-size", "4"], "must divide the attention heads (6), KV heads (2)"),
])
def test_cli_refuses_what_tp_cannot_run(folder, flags, message, capsys):
    assert main(["--model", str(folder), "--prompt", "x", "--tensor-parallel-size", "2", *flags]) == 2
    assert message in capsys.readouterr().err
