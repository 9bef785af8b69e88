"""`python -m course.final serve` as a user runs it: a real process, a real port."""
import json
import signal

import httpx
import openai
import pytest

from course.final.cli import main
from course.final.launch.kv_pool import parse_size
from course.final.testing import start_cli_server as start
from course.final.testing import stop_cli_server as stop


@pytest.mark.parametrize("text,size", [("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1e9", 10**9),
                                       ("3kb", 3000), ("100", 100)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "5XB", ""])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(ValueError, match="--kv-memory"):
        parse_size(text)


def test_cli_serves_a_model_folder(tiny_folder):
    proc, url = start("--model", str(tiny_folder), "--kv-memory", "1MiB", "--served-model-name", "tiny")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 4
        assert [m.id for m in client.models.list()] == ["tiny"]
    finally:
        assert stop(proc) == 0


def test_cli_serves_a_qwen3_folder_transformers_wrote(tmp_path, byte_tok):
    """`--model` on a Qwen3 folder as transformers saves one (its Qwen3Config, save_pretrained):
    a chat request's greedy tokens and logprobs are transformers' own; /v1/models names it."""
    from transformers import Qwen3Config

    from course.final.testing import CHAT_TEMPLATE
    from course.s01_decode_loop.testing import greedy_reference, save_transformers_model

    byte_tok.chat_template = CHAT_TEMPLATE
    config = Qwen3Config(vocab_size=258, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
                         bos_token_id=256, eos_token_id=257)
    hf = save_transformers_model(config, byte_tok, tmp_path)
    messages = [{"role": "user", "content": "hi"}]
    ids = byte_tok(byte_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False).input_ids
    tokens, logprobs = greedy_reference(hf, ids, 8)
    proc, url = start("--model", str(tmp_path), "--kv-memory", "1MiB", "--served-model-name", "qwen3-tiny")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.chat.completions.create(model="qwen3-tiny", messages=messages, max_tokens=8, temperature=0,
                                             logprobs=True, extra_body={"ignore_eos": True})
        card = httpx.get(url + "/v1/models").json()["data"][0]
    finally:
        assert stop(proc) == 0
    got = out.choices[0].logprobs.content
    assert [t.token for t in got] == [byte_tok.decode([t]) for t in tokens]
    assert all(abs(t.logprob - want) < 1e-4 for t, want in zip(got, logprobs, strict=True))
    assert (card["id"], card["architecture"]) == ("qwen3-tiny", "Qwen3ForCausalLM")


def test_cli_serves_a_sliding_window_mistral_folder(tmp_path, byte_tok):
    """A Mistral whose window (6) is far shorter than the prompt plus the answer: greedy tokens
    equal transformers' own full forward, and the start-up says what the window does to the pool."""
    from transformers import MistralConfig

    from course.s01_decode_loop.testing import greedy_reference_uncached, save_transformers_model

    config = MistralConfig(vocab_size=258, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                           max_position_embeddings=512, bos_token_id=256, eos_token_id=257)
    hf = save_transformers_model(config, byte_tok, tmp_path)
    prompt = list(range(40, 60))
    proc, url = start("--model", str(tmp_path), "--kv-memory", "1MiB", "--block-size", "4", "--attention-backend", "torch")
    try:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 0}
        out = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        card = httpx.get(url + "/v1/models").json()["data"][0]
    finally:
        assert stop(proc) == 0
    tokens = out["choices"][0]["logprobs"]["tokens"]
    assert tokens == [byte_tok.decode([t]) for t in greedy_reference_uncached(hf, prompt, 16)]
    assert card["architecture"] == "MistralForCausalLM"
    assert "sliding window of 6 tokens in every layer: a sequence holds at most 3 blocks" in proc.stdout.read()


def test_cli_sigterm_drains_then_exits_cleanly(tiny_folder):
    """SIGTERM with a stream in flight: the stream ends properly (finished, or stopped with a
    shutdown error event), the process exits 0 on its own, having said it drained."""
    proc, url = start("--model", str(tiny_folder), "--kv-memory", "1MiB", "--drain-timeout", "0.5")
    lines = []
    try:
        body = {"prompt": "go", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 4:
                    proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    data = [x[6:] for x in lines if x.startswith("data: ")]
    assert data[-1] == "[DONE]"
    last = json.loads(data[-2])
    assert last.get("choices", [{}])[0].get("finish_reason") == "length" or "shutting down" in last["error"]["message"]
    assert "Draining" in proc.stdout.read()


@pytest.mark.parametrize("args,message", [
    (["--model", "{tmp}/missing"], "error:"),
    (["--model", "{tiny}", "--kv-memory", "lots"], "cannot read 'lots'"),
    (["--model", "{tiny}", "--kv-memory", "16"], "holds no block"),
    (["--model", "{tiny}", "--speculative-method", "eagle"], "cannot load the EAGLE head"),
    (["--model", "{tiny}", "--speculative-method", "eagle", "--speculative-model", "{tmp}/head.safetensors"],
     "no such file"),
    (["--model", "{tiny}", "--speculative-method", "lookup", "--num-speculative-tokens", "300"], "leaves no room"),
    (["--model", "{tiny}", "--speculative-method", "lookup", "--num-speculative-tokens", "0"], "at least 1"),
    (["--model", "{tiny}", "--speculative-method", "lookup", "--speculative-tree"], "needs --speculative-method eagle"),
    (["--model", "{tiny}", "--quantization", "int8", "--no-fused"], "needs the fused model"),
    (["--model", "{tiny}", "--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
])
def test_cli_bad_arguments_exit_2_with_a_message(tiny_folder, tmp_path, capsys, args, message):
    args = [a.format(tmp=tmp_path, tiny=tiny_folder) for a in args]
    assert main(["serve", *args]) == 2
    assert message in capsys.readouterr().err


def ask_for_the_capital_of_france(*flags: str) -> str:
    proc, url = start(*flags)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=12, temperature=0,
                                             messages=[{"role": "user", "content": "What is the capital of France?"}])
        return out.choices[0].message.content
    finally:
        assert stop(proc) == 0


@pytest.mark.slow
def test_cli_serves_the_default_model_with_no_arguments(smollm2):
    """The README's first command: no flags, the default model, an answer a person can check."""
    assert "Paris" in ask_for_the_capital_of_france()


@pytest.mark.slow
def test_cli_serves_the_default_model_with_int8_weights(smollm2):
    """`--quantization int8`: the same question, still the right answer (outputs are close to
    float32's, not equal, so the check is the answer a person would check)."""
    assert "Paris" in ask_for_the_capital_of_france("--quantization", "int8")


@pytest.mark.slow
def test_cli_serves_the_default_model_with_an_int8_kv_cache(smollm2):
    """`--kv-cache-dtype int8`: K/V stored as int8 codes and scales, the right answer still."""
    assert "Paris" in ask_for_the_capital_of_france("--kv-cache-dtype", "int8")


@pytest.mark.parametrize("flags, policy", [(["--speculative-method", "lookup"], "cost"),
                                           (["--speculative-method", "lookup", "--speculative-policy", "fixed"], None),
                                           ([], None)])
def test_speculation_is_served_with_the_cost_policy_unless_fixed_is_asked(tiny_folder, flags, policy):
    from course.final.cli import build_server, make_parser
    from course.final.speculation.policy import CostModelPolicy

    args = make_parser()[0].parse_args(["serve", "--model", str(tiny_folder), "--kv-memory", "1MiB", *flags])
    engine, _ = build_server(args)
    chosen = engine.engine.draft_policy
    assert (type(chosen) is CostModelPolicy) if policy == "cost" else chosen is None
