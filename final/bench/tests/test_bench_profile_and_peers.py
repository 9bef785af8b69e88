"""The profiler and the peer benchmark count what they claim to count (on the tiny model;
their figures come from the default model, in the READMEs)."""
import pytest

from course.final.bench.peers import measure_server, our_client_standard
from course.final.bench.standard_load import standard_requests
from course.final.launch.sizing import (BUDGET, GPU_BUDGET, KV_CAP, KV_SHARE, SEQS, available_memory, cpu_kv_bytes,
                                        step_sizes)
from course.final.bench.profile import PHASES, PhaseClock, breakdown, instrument, uninstrument
from course.final.engine import Engine
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s06_kernels_graphs.engine import KernelEngineConfig


def test_phases_add_up_to_the_steps_and_every_part_is_timed(byte_tok):
    import course.s04_continuous_batching.engine as batching
    from course.s06_kernels_graphs.cpu.layer import LayerCalls
    before = (batching.sample_batch, LayerCalls.__dict__["run"])
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=12, fused=True, linear_splits=2)
    engine = Engine(tiny_model("gqa_tied"), byte_tok, config, prefetch_masks=False)
    clock = PhaseClock()
    instrument(engine, clock)
    try:
        outputs = engine.generate([list(b"hello there"), list(b"a longer prompt than the budget")],
                                  SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True))
    finally:
        uninstrument()  # the sampler and the one-call layers are wrapped module- and class-wide
    assert (batching.sample_batch, LayerCalls.__dict__["run"]) == before
    assert [len(o.token_ids) for o in outputs] == [5, 5]
    phases = breakdown(clock)
    assert set(phases) == set(PHASES)
    assert all(phases[p] > 0 for p in ("schedule", "prepare", "linear", "attention", "other fwd", "lm_head", "sample"))
    assert abs(sum(phases.values()) - clock.seconds["step"]) < 1e-9  # exclusive phases: no double count
    assert clock.calls["step"] == clock.calls["attention"] // engine.runner.model.config.num_hidden_layers


def test_peer_measurement_against_a_live_server(server):
    url, _ = server
    light = [("one", 4), ("two", 6), ("three", 3)]
    standard = [("a raw prompt", 5), ("another", 2)]
    r = measure_server(url, light, light_prompt_tokens=30, reps=2,
                       standard=our_client_standard(standard, prompt_tokens=20))
    assert r["light_failed"] == 0 and r["standard_failed"] == 0 and r["errors"] == []
    assert abs(r["light_output_tok_s"] * r["light_seconds"] - 13) < 1e-6  # every token asked for
    assert abs(r["light_total_tok_s"] * r["light_seconds"] - 43) < 1e-6  # 30 prompt + 13 output tokens
    assert abs(r["standard_total_tok_s"] * r["standard_seconds"] - 27) < 1e-6  # 20 prompt + 7 output tokens
    assert r["single_decode_tok_s"] > 0 and r["single_ttft_s"] > 0 and r["standard_ttft_p50_s"] > 0


class WordTokenizer:
    """A tokenizer of whitespace-separated words, as vLLM's sampler calls one: tok(text).input_ids."""

    def __call__(self, text):
        return type("Encoding", (), {"input_ids": text.split()})()


def test_standard_load_samples_as_vllm_does():
    import random

    words = lambda n: " ".join(["w"] * n)  # noqa: E731
    conversations = [[{"from": "gpt" if i % 3 == 0 else "human", "value": words(3 + 200 * (i % 7))},
                      {"from": "gpt", "value": "x"}] for i in range(60)]
    conversations += [[{"from": "human", "value": words(50)}]] * 10  # one turn: never sampled
    requests = standard_requests(WordTokenizer(), n=20, seed=3, conversations=conversations)
    assert len(requests) == 20 and all(n == 128 for _, n in requests)
    # vLLM's order: keep conversations of two turns or more, random.seed(seed); random.shuffle
    kept = [c for c in conversations if len(c) >= 2]
    random.seed(3)
    random.shuffle(kept)
    expected = [c[0]["value"] for c in kept if 4 <= len(c[0]["value"].split()) <= 1024][:20]
    assert [p for p, _ in requests] == expected
    assert all(4 <= len(p.split()) <= 1024 for p, _ in requests)  # 3- and 1,203-word prompts are out
    assert any(c[0]["from"] == "gpt" and c[0]["value"] == p for p, _ in requests for c in kept)  # whoever speaks first


def test_cpu_pool_and_step_sizes():
    from argparse import Namespace
    GiB = 2**30
    assert cpu_kv_bytes({"VLLM_CPU_KVCACHE_SPACE": "1.5"}, available=100 * GiB) == (int(1.5 * GiB),
                                                                                    "VLLM_CPU_KVCACHE_SPACE=1.5 GiB")
    size, why = cpu_kv_bytes({}, available=20 * GiB)
    assert size == int(KV_SHARE * 20 * GiB) and "20.0 GiB available" in why
    assert cpu_kv_bytes({}, available=1000 * GiB)[0] == KV_CAP
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE"):
        cpu_kv_bytes({"VLLM_CPU_KVCACHE_SPACE": "lots"}, available=GiB)
    args = Namespace(max_num_seqs=None, max_num_batched_tokens=None)
    assert "this CPU" in step_sizes(args, "cpu") and (args.max_num_seqs, args.max_num_batched_tokens) == (SEQS, BUDGET)
    args = Namespace(max_num_seqs=7, max_num_batched_tokens=None)
    line = step_sizes(args, "cuda")
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (7, GPU_BUDGET) and "max_num_seqs and" not in line
    assert available_memory() is None or available_memory() > 0


def test_sharegpt_file_is_what_vllms_loader_reads(tmp_path, monkeypatch):
    """vLLM's ShareGPT loader json.loads the file and keeps entries whose "conversations" hold two
    turns or more: the salvaged records, complete, in that shape (written once, then reused)."""
    import json

    from course.final.bench import peer_clients
    conversations = [[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], [{"from": "gpt", "value": "x"}]]
    monkeypatch.setattr(peer_clients, "load_conversations", lambda: conversations)
    path = peer_clients.sharegpt_file(str(tmp_path))
    data = json.load(open(path))
    assert data == [{"conversations": c} for c in conversations]
    monkeypatch.setattr(peer_clients, "load_conversations", lambda: pytest.fail("read again"))
    assert peer_clients.sharegpt_file(str(tmp_path)) == path


def test_the_stored_rows_carry_the_names_their_writers_give():
    """The README picks rows by name: a rerun of each benchmark names its rows as the stored ones."""
    import json
    from pathlib import Path

    from course.final.bench.peers import row_name
    from course.final.scheduling.bench import run_name
    results = Path(__file__).parents[2] / "results"
    rows = lambda name, key: json.loads((results / name).read_text())[key]  # noqa: E731
    assert [row_name(r["server"]) for r in rows("peers.json", "rows")] == [r["name"] for r in rows("peers.json", "rows")]
    assert row_name("this server --max-num-seqs 32 --kv-blocks 512") == "this-server/max-num-seqs-32/kv-blocks-512"
    assert [r["variant"].replace(" ", "-") for r in rows("precision_2core_cpu.json", "rows")] == \
        [r["name"] for r in rows("precision_2core_cpu.json", "rows")]
    assert [r["workload"] for r in rows("profile.json", "results")] == [r["name"] for r in rows("profile.json", "results")]
    for name in ("scheduling_sim.json", "scheduling_pool_512_blocks.json", "scheduling_pool_1024_blocks.json"):
        runs = rows(name, "simulated")
        assert [run_name(r["cost_model"], r["load"], r["policy"]) for r in runs] == [r["name"] for r in runs]
    assert run_name("gpu-like (derived)", 1.0, "fcfs") == "gpu-like/load=1/fcfs"
