"""Stage 07's command line with --tensor-parallel-size: the prompts through a two-process engine
print what the TP=1 engine generates; combinations it cannot run are refused before any rank starts."""
import json

import pytest

from course.s01_decode_loop.sampling import SamplingParams
from course.s07_disaggregated.cli import main
from course.s07_disaggregated.tensor_parallel.testing import reference_engine, save_tp_tiny

PROMPTS = ["Hello", "The quick brown fox jumps"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    return save_tp_tiny(byte_tok, tmp_path_factory.mktemp("tp_cli"))


def test_cli_prompts_through_tp2_print_the_tp1_tokens(folder, byte_tok, capsys):
    args = ["--model", str(folder), "--tensor-parallel-size", "2", "--max-new-tokens", "10", "--json",
            "--kv-blocks", "64", "--block-size", "4", *[a for p in PROMPTS for a in ("--prompt", p)]]
    assert main(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    want = reference_engine(folder, num_blocks=64, block_size=4).generate(
        [byte_tok.encode(p) for p in PROMPTS], SamplingParams(max_new_tokens=10, temperature=0))
    assert [r["token_ids"] for r in rows] == [o.token_ids for o in want]


@pytest.mark.parametrize("flags,message", [
    (["--replicas", "2"], "does not combine with --prefill/--decode/--replicas"),
    (["--tensor-parallel-size", "4"], "must divide the attention heads (6), KV heads (2)"),
])
def test_cli_refuses_what_tp_cannot_run(folder, flags, message, capsys):
    assert main(["--model", str(folder), "--prompt", "x", "--tensor-parallel-size", "2", *flags]) == 2
    assert message in capsys.readouterr().err
