"""Grammar after thinking, inside the speculating batch: the thinking runs free, the end tag
closes it (forced by a budget at every offset of the draft window), and from the next token the
answer is held to its schema. Over 216 requests with lookup, EAGLE and oracle drafts (cut where
the tag or the grammar forbids them), every answer validates and every output equals the
engine's without speculation."""
import json

import jsonschema
import pytest

from course.final.engine import Engine, SpeculativeConfig
from course.final.tests.test_engine_speculative import random_eagle
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s05_speculative.drafter import Draft, Drafter
from course.s06_kernels_graphs.engine import KernelEngineConfig
from course.s08_structured.generate import GrammarLogitsProcessor
from course.s08_structured.json_schema import json_schema_to_grammar
from course.s08_structured.matcher import compile_grammar
from course.s08_structured.reasoning import EndOfThinking, ThinkingGate, ThinkingTags, split_reasoning
from course.s08_structured.serving.closing import CloseOnBudget
from course.s08_structured.vocab import TokenizerInfo

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
K = 4  # drafts per step
BUDGETS = range(9)  # the forced tag's last token lands at every offset of the window
PROMPTS = [b"Think, then answer: </think>{\"n\": 1, \"ok\": true}", b"x", b"0123456789" * 2,
           b"<think>a b c</think>", b"The cat sat on the mat. The cat", b"{}", b"</think></think>", b"ab" * 9]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def setup(byte_tok):
    eos = byte_tok.eos_token_id
    info = TokenizerInfo.from_huggingface(byte_tok, stop_ids=[eos])
    compiled = compile_grammar(json_schema_to_grammar(SCHEMA), info)
    end = EndOfThinking(info, "</think>", list(b"</think>"))
    return tiny_model("mha_untied"), compiled, end, eos


def gate(compiled, end, budget):
    grammar = GrammarLogitsProcessor(compiled, max_new_tokens=MAX_TOKENS, narrow=CloseOnBudget())
    return ThinkingGate(end, grammar, budget=budget, max_new_tokens=MAX_TOKENS)


def run(engine, compiled, end, budget):
    params = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
    ids = [engine.add_request(list(p), params, grammar=gate(compiled, end, budget)) for p in PROMPTS]
    while engine.has_unfinished():
        engine.step()
    return [engine.requests[i].seq.output_ids for i in ids]


class Oracle(Drafter):
    """The true continuation, one token in six wrong: rejections move each window's start."""

    def __init__(self, truth):
        self.truth = truth

    def propose(self, seq, k):
        future = self.truth[tuple(seq.prompt_ids)][len(seq.output_ids):][:k]
        return Draft([t if (len(seq.output_ids) + i) % 6 else (t + 1) % 256 for i, t in enumerate(future)])


class Watched(Engine):
    """Records each verified window: its request's prompt, the output length before it, its drafts."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.windows = []

    def _verify(self, req, rows, drafts):
        self.windows.append((tuple(req.seq.prompt_ids), len(req.seq.output_ids), len(drafts)))
        return super()._verify(req, rows, drafts)


def tag_offsets(windows, outputs) -> set[int]:
    """Where, in the windows that held it, the token closing the thinking fell (0: the window's first row)."""
    closes = {tuple(p): bytes(o[:-1]).find(b"</think>") + len(b"</think>") - 1 for p, o in zip(PROMPTS, outputs)}
    return {closes[p] - done for p, done, n in windows if done <= closes[p] <= done + n}


@pytest.mark.parametrize("method", ["oracle", "lookup", "eagle"])
def test_answers_after_thinking_validate_and_equal_unspeculated_ones(byte_tok, setup, method):
    model, compiled, end, eos = setup
    config = KernelEngineConfig(num_blocks=160, block_size=4, max_num_seqs=8)
    checked = 0
    offsets = set()
    for budget in BUDGETS:
        want = run(Engine(model, byte_tok, config, [eos]), compiled, end, budget)
        drafter = {"oracle": Oracle({tuple(p): w for p, w in zip(PROMPTS, want)}),
                   "lookup": None, "eagle": random_eagle(model)}[method]
        engine = Watched(model, byte_tok, config, [eos], SpeculativeConfig("lookup", K), drafter=drafter)
        got = run(engine, compiled, end, budget)
        assert got == want
        offsets |= tag_offsets(engine.windows, got)
        for ids in got:
            text = bytes(i for i in ids if i != eos)  # one token per byte
            thinking, tag, answer = text.partition(b"</think>")
            assert tag and len(thinking) <= budget  # a spent budget closed the thinking
            jsonschema.validate(json.loads(answer), SCHEMA)
            assert split_reasoning(text.decode(errors="replace"), ThinkingTags(), True)[1] == answer.decode().lstrip()
            checked += 1
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert checked == len(BUDGETS) * len(PROMPTS)
    if method == "oracle":  # the tag closed the thinking at every place of a window
        assert offsets >= set(range(K + 1)), offsets
    if method != "lookup":
        assert engine.spec_stats.proposed > 0
