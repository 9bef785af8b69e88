"""Completions as evaluation harnesses send them: echo, prompt logprobs, token-id and list prompts,
/tokenize and /detokenize, against transformers' log-softmax of the prompt."""
import math

import httpx
import openai
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from course.final.testing import live_server, tiny_engine
from course.s01_decode_loop.testing import tiny_model

TEXT = "The quick brown fox jumps over the lazy dog, again and again."


@pytest.fixture(scope="module")
def server(byte_tok):
    """A tiny server whose prefill runs in chunks of 8 tokens, its prefix cache on."""
    with live_server(tiny_engine(byte_tok, max_num_batched_tokens=8), byte_tok) as url:
        yield url


@pytest.fixture(scope="module")
def reference():
    """transformers' LlamaForCausalLM holding the tiny server's weights."""
    model = tiny_model("gqa_tied")
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**model.config.to_hf()), dtype=torch.float32).eval()
    hf.load_state_dict(model.state_dict(), strict=False)
    return hf


@torch.no_grad()
def prompt_logprobs(hf, ids: list[int]) -> list[float]:
    """log P(token p | tokens before it) for p = 1 .. len(ids) - 1."""
    logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [float(logp[p - 1, ids[p]]) for p in range(1, len(ids))]


def completions(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def assert_close(got: list, want: list, tol: float = 1e-3) -> None:
    assert len(got) == len(want)
    assert all(math.isclose(g, w, abs_tol=tol) for g, w in zip(got, want)), list(zip(got, want))


@pytest.mark.parametrize("as_ids", [False, True])
def test_echo_logprobs_equal_transformers_across_prefill_chunks(server, reference, byte_tok, as_ids):
    ids = byte_tok(TEXT).input_ids  # 62 tokens: 8 chunks of prefill
    for _ in range(2):  # the second time its blocks are in the prefix cache: still every row is scored
        out = completions(server, prompt=ids if as_ids else TEXT, echo=True, logprobs=2, max_tokens=0)
        choice = out["choices"][0]
        lp = choice["logprobs"]
        assert choice["text"] == TEXT and choice["finish_reason"] == "length"
        assert lp["tokens"] == [byte_tok.decode([i]) for i in ids]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert_close(lp["token_logprobs"][1:], prompt_logprobs(reference, ids))
        assert all(len(top) <= 2 and max(top.values()) >= got - 1e-6
                   for top, got in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]))
        assert lp["text_offset"] == list(range(len(ids)))
        assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}


def test_lm_eval_local_completions_request(server, reference, byte_tok):
    """The shape lm-evaluation-harness's local-completions sends for loglikelihood: token-id
    prompts (context + continuation), echo, logprobs 1, max_tokens 0 or 1; it reads
    token_logprobs[ctxlen:-1] of each choice sorted by index (max_tokens 1: the last is generated)."""
    contexts = [byte_tok("Paris is the capital of").input_ids, byte_tok("Two plus two is").input_ids]
    continuations = [byte_tok(" France").input_ids, byte_tok(" four").input_ids]
    prompts = [c + k for c, k in zip(contexts, continuations)]
    for max_tokens in (0, 1):
        out = completions(server, model="tiny", prompt=prompts, echo=True, logprobs=1, max_tokens=max_tokens,
                          temperature=0, seed=1234)
        choices = sorted(out["choices"], key=lambda c: c["index"])
        assert [c["index"] for c in out["choices"]] == [0, 1]
        for choice, context, prompt in zip(choices, contexts, prompts):
            lps = choice["logprobs"]["token_logprobs"]
            assert len(lps) == len(prompt) + max_tokens
            scored = lps[len(context):len(prompt)]
            assert_close(scored, prompt_logprobs(reference, prompt)[len(context) - 1:])
            is_greedy = all(lp == max(top.values()) for lp, top in zip(
                scored, choice["logprobs"]["top_logprobs"][len(context):len(prompt)]))
            assert isinstance(is_greedy, bool)


def test_list_prompts_give_choices_in_openais_order(server, byte_tok):
    kw = dict(max_tokens=3, temperature=0)
    alone = [completions(server, prompt=p, **kw)["choices"][0]["text"] for p in ("ab", "cd", "ef")]
    out = completions(server, prompt=["ab", "cd", "ef"], n=2, **kw)
    assert [c["index"] for c in out["choices"]] == list(range(6))  # prompt index * n + choice
    assert [c["text"] for c in out["choices"]] == [t for t in alone for _ in range(2)]
    assert out["usage"]["prompt_tokens"] == 6 and out["usage"]["completion_tokens"] == 18
    ids_out = completions(server, prompt=[byte_tok("ab").input_ids, byte_tok("ef").input_ids], **kw)
    assert [c["text"] for c in ids_out["choices"]] == [alone[0], alone[2]]


def test_echo_with_an_answer_joins_prompt_and_answer(server, byte_tok):
    plain = completions(server, prompt="Hello", max_tokens=4, temperature=0, logprobs=1)["choices"][0]
    echoed = completions(server, prompt="Hello", max_tokens=4, temperature=0, logprobs=1, echo=True)["choices"][0]
    assert echoed["text"] == "Hello" + plain["text"]
    lp, gen = echoed["logprobs"], plain["logprobs"]
    assert lp["tokens"] == list("Hello") + gen["tokens"]
    assert lp["token_logprobs"][5:] == gen["token_logprobs"]
    assert lp["text_offset"] == [0, 1, 2, 3, 4] + [5 + o for o in gen["text_offset"]]
    no_lp = completions(server, prompt="Hello", max_tokens=2, temperature=0, echo=True)["choices"][0]
    assert no_lp["text"].startswith("Hello") and no_lp["logprobs"] is None


def test_prompt_logprobs_in_vllms_shape_on_completions_and_chat(server, reference, byte_tok):
    ids = byte_tok("Hello there").input_ids
    out = completions(server, prompt="Hello there", prompt_logprobs=3, max_tokens=1, n=2)
    want = prompt_logprobs(reference, ids)
    for choice in out["choices"]:
        rows = choice["prompt_logprobs"]
        assert rows[0] is None and len(rows) == len(ids)
        for p, row in enumerate(rows[1:], start=1):
            mine = row[str(ids[p])]
            assert math.isclose(mine["logprob"], want[p - 1], abs_tol=1e-3)
            assert mine["decoded_token"] == byte_tok.decode([ids[p]]) and mine["rank"] >= 1
            assert 3 <= len(row) <= 4 and {e["rank"] for k, e in row.items() if k != str(ids[p])} <= {1, 2, 3}
    messages = [{"role": "user", "content": "hi there"}]
    chat = httpx.post(server + "/v1/chat/completions", json={"messages": messages, "prompt_logprobs": 0,
                                                             "max_tokens": 2}).json()
    template_ids = httpx.post(server + "/tokenize", json={"messages": messages}).json()["tokens"]
    assert chat["usage"]["prompt_tokens"] == len(template_ids)
    got = [row[str(t)]["logprob"] for row, t in zip(chat["prompt_logprobs"][1:], template_ids[1:])]
    assert_close(got, prompt_logprobs(reference, template_ids))


def test_the_openai_client_sends_harness_prompts(server, byte_tok):
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    out = client.completions.create(model="tiny", prompt=[byte_tok("a cat").input_ids, byte_tok("a dog").input_ids],
                                    echo=True, logprobs=1, max_tokens=0)
    assert [c.text for c in out.choices] == ["a cat", "a dog"]
    assert out.choices[1].logprobs.token_logprobs[0] is None and len(out.choices[1].logprobs.tokens) == 5


def test_tokenize_and_detokenize_as_vllm_serves_them(server, byte_tok):
    t = httpx.post(server + "/tokenize", json={"model": "tiny", "prompt": "Hey", "return_token_strs": True}).json()
    assert t == {"count": 3, "max_model_len": 512, "tokens": byte_tok("Hey").input_ids, "token_strs": ["H", "e", "y"]}
    assert httpx.post(server + "/detokenize", json={"tokens": t["tokens"]}).json() == {"prompt": "Hey"}
    chat = httpx.post(server + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    answer = completions(server, prompt=chat["tokens"], max_tokens=1)
    assert answer["usage"]["prompt_tokens"] == chat["count"] and chat["token_strs"] is None


@pytest.mark.parametrize("route,body,names", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "echo": True, "stream": True}, "stream"),
    ("/v1/completions", {"prompt": ["x", "y"], "stream": True}, "stream"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": [1, 10**6]}, "token id"),
    ("/v1/completions", {"prompt": [1, -1]}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt"),
    ("/v1/completions", {"prompt": ["x", "y" * 600], "echo": True, "max_tokens": 0}, "prompt[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1,
                              "stream": True}, "prompt_logprobs"),
    ("/tokenize", {"prompt": "x", "messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
     "continue_final_message"),
    ("/detokenize", {"tokens": [1, 999]}, "tokens"),
])
def test_harness_refusals_name_the_field(server, route, body, names):
    r = httpx.post(server + route, json=body)
    assert r.status_code == 400, r.text
    assert names in r.json()["error"]["message"]


@pytest.mark.slow
def test_echo_logprobs_equal_transformers_on_the_default_model(smollm2):
    from course.final.async_engine import AsyncEngine
    from course.final.engine import Engine
    from course.s06_kernels_graphs.engine import KernelEngineConfig

    llm = Engine(smollm2.model, smollm2.tokenizer, KernelEngineConfig(num_blocks=64, max_num_batched_tokens=16),
                 smollm2.eos_token_ids)
    hf = AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()
    text = "The capital of France is Paris, and the capital of Italy is Rome."
    ids = smollm2.tokenizer(text).input_ids
    with live_server(AsyncEngine(llm), smollm2.tokenizer) as url:
        for prompt in (text, ids):
            lp = completions(url, prompt=prompt, echo=True, logprobs=1, max_tokens=0)["choices"][0]["logprobs"]
            assert_close(lp["token_logprobs"][1:], prompt_logprobs(hf, ids))
