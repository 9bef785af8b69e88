"""Overlap scheduling in the engine as served: through the server, concurrent requests of every
kind (greedy of different lengths, seeded sampling, a grammar, logprobs) get the tokens the
synchronous engine gives them, steps really run ahead of their reads, and every block comes back;
with a drafter the engine never defers (drafts are made from the host's tokens)."""
from concurrent.futures import ThreadPoolExecutor

import httpx

from course.final.engine import Engine, SpeculativeConfig
from course.final.testing import live_server, tiny_engine
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig

PLAIN = [{"prompt": p, "max_tokens": m, "temperature": 0} for p, m in
         [("The sea", 24), ("a", 9), ("0123456789", 17), ("hello there", 30)]]
BODIES = PLAIN + [{"prompt": "seeded", "max_tokens": 20, "temperature": 0.9, "top_p": 0.9, "seed": 7},
           {"prompt": "json", "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}},
           {"prompt": "scores", "max_tokens": 8, "temperature": 0, "logprobs": 2}]


def served(byte_tok, overlap: bool):
    engine = tiny_engine(byte_tok, overlap=overlap, max_num_seqs=4, max_num_batched_tokens=16)
    with live_server(engine, byte_tok) as url:
        with ThreadPoolExecutor(len(BODIES)) as pool:  # every kind at once, then plain decodes alone
            answers = []
            for bodies in (BODIES, PLAIN):
                answers += pool.map(lambda body: httpx.post(url + "/v1/completions", json=body, timeout=120).json(),
                                    bodies)
        stats = engine.call(lambda e: e.stats())
    return [(a["choices"][0]["text"], a["choices"][0]["finish_reason"]) for a in answers], stats


def test_served_overlap_equals_the_synchronous_engine(byte_tok):
    want, _ = served(byte_tok, overlap=False)
    got, stats = served(byte_tok, overlap=True)
    assert got == want
    assert stats["overlapped_steps"] > 0
    assert stats["free_blocks"] == stats["num_blocks"] and stats["running"] == stats["waiting"] == 0


def test_a_drafting_engine_never_defers(byte_tok):
    model = tiny_model("gqa_tied")
    prompts = [list(b"abcabcabcabc"), list(b"the cat, the cat, the")]
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = []
    for overlap in (False, True):
        config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=16,
                                    overlap=overlap)
        engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 3))
        outputs.append([o.token_ids for o in engine.generate(prompts, params)])
    assert outputs[0] == outputs[1]
    assert engine.stats()["overlapped_steps"] == 0 and engine.spec_stats.proposed > 0
