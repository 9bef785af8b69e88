"""The server runs stage 06's engine: the same answers whichever attention backend, fused ops
or decode graphs it is given, and the CLI picks the GPU defaults only where there is a GPU."""
import argparse

import openai
import pytest

from course.final.launch.kernel_options import kernel_options
from course.final.testing import live_server, tiny_engine

SETTINGS = {"torch": {}, "torch+fused+graphs": {"fused": True, "cuda_graphs": True},
            "torch+fused+split": {"fused": True, "linear_splits": 2},
            "cpu+fused+split": {"attention_backend": "cpu", "fused": True, "linear_splits": 2},
            "triton+graphs": {"attention_backend": "triton", "cuda_graphs": True}}


def answers(byte_tok, settings):
    engine = tiny_engine(byte_tok, **settings)
    with live_server(engine, byte_tok) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        texts = [client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0).choices[0].text
                 for p in ("Hello", "a much longer prompt than the first")]
        texts += [c.text for c in client.completions.create(model="tiny", prompt="xy", max_tokens=6, temperature=1.0,
                                                              seed=3, n=2).choices]
        return texts, engine.engine.stats()


def test_server_answers_are_the_same_with_every_kernel_setting(byte_tok):
    want, _ = answers(byte_tok, SETTINGS["torch"])
    for name in ("torch+fused+graphs", "torch+fused+split", "cpu+fused+split", "triton+graphs"):
        got, stats = answers(byte_tok, SETTINGS[name])
        assert got == want, name
        assert (stats["graphed_steps"] > 0) == ("graphs" in name) and stats["backend"] == name.split("+")[0]


@pytest.mark.parametrize("device, threads, flags, want", [
    ("cpu", 2, {}, {"attention_backend": "cpu", "cuda_graphs": False, "fused": True, "linear_splits": 2}),
    ("cpu", 1, {}, {"attention_backend": "cpu", "cuda_graphs": False, "fused": False, "linear_splits": 1}),
    ("cpu", 2, {"linear_splits": 1}, {"attention_backend": "cpu", "cuda_graphs": False, "fused": False,
                                      "linear_splits": 1}),
    ("cpu", 2, {"fused": False, "linear_splits": 1, "attention_backend": "torch"},
     {"attention_backend": "torch", "cuda_graphs": False, "fused": False, "linear_splits": 1}),
    ("cpu", 2, {"dtype": "bfloat16"}, {"attention_backend": "torch", "cuda_graphs": False, "fused": True,
                                       "linear_splits": 2}),  # the C kernel reads float32 pools only
    ("cuda", 2, {}, {"attention_backend": "triton", "cuda_graphs": True, "fused": True, "linear_splits": 1}),
    ("cuda", 2, {"cuda_graphs": False, "attention_backend": "torch"},
     {"attention_backend": "torch", "cuda_graphs": False, "fused": True, "linear_splits": 1}),
    ("cpu", 1, {"quantization": "int8"}, {"attention_backend": "cpu", "cuda_graphs": False, "fused": True,
                                          "linear_splits": 1, "quantization": "int8"}),
    ("cpu", 2, {"fused": True, "cuda_graphs": True},  # the graph stand-in checks the torch path
     {"attention_backend": "torch", "cuda_graphs": True, "fused": True, "linear_splits": 2}),
])
def test_cli_kernel_defaults_follow_the_device(device, threads, flags, want, monkeypatch):
    monkeypatch.setattr("torch.get_num_threads", lambda: threads)
    args = argparse.Namespace(device=device, attention_backend=None, cuda_graphs=None, fused=None, linear_splits=None,
                              quantization=None)
    for key, value in flags.items():
        setattr(args, key, value)
    assert kernel_options(args) == {"quantization": None, "overlap": device == "cuda",
                                    "triton_kernels": "gpu" if device == "cuda" else "lesson"} | want


def test_without_a_c_compiler_the_server_keeps_the_torch_backend(tmp_path, monkeypatch):
    from course.final.launch.kernel_defaults import describe, kernel_defaults
    from course.s06_kernels_graphs.cpu import native

    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("COURSE_KERNEL_CACHE", str(tmp_path / "cache"))
    native.forget_loaded()
    try:
        options = kernel_defaults("cpu")
        assert options["attention_backend"] == "torch"
        assert "the C kernel is unavailable: no C compiler" in describe(options)  # said at start-up
    finally:
        monkeypatch.undo()
        native.forget_loaded()
    assert kernel_defaults("cpu")["attention_backend"] == "cpu"


def test_cli_refuses_split_linears_without_the_fused_model(monkeypatch):
    monkeypatch.setattr("torch.get_num_threads", lambda: 2)
    args = argparse.Namespace(device="cpu", attention_backend=None, cuda_graphs=None, fused=False, linear_splits=None)
    with pytest.raises(ValueError, match="--no-fused"):
        kernel_options(args)


@pytest.mark.parametrize("backend", ["torch", "cpu"])  # cpu: verification chunks go through the C kernel
def test_server_with_prompt_lookup_gives_the_same_answers_and_counts_drafts(byte_tok, backend):
    from course.final.engine import SpeculativeConfig
    from course.final.testing import metric
    want, _ = answers(byte_tok, {})
    engine = tiny_engine(byte_tok, speculative=SpeculativeConfig("lookup", 3), attention_backend=backend)
    with live_server(engine, byte_tok) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        got = [client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0).choices[0].text
               for p in ("Hello", "a much longer prompt than the first")]
        stats = engine.engine.spec_stats
        assert got == want[:2] and stats.proposed > 0
        assert metric(url, "vllm:spec_decode_num_draft_tokens_total") == stats.proposed
        assert metric(url, "vllm:spec_decode_num_accepted_tokens_total") == stats.accepted
        assert metric(url, "vllm:spec_decode_num_drafts_total") == stats.target_forwards
