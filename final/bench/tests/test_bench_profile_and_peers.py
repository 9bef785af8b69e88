"""The profiler and the peer benchmark count what they claim to count (on the tiny model;
their figures come from the default model, in the READMEs)."""
from course.final.bench.peers import measure_server
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
    requests = [("one", 4), ("two", 6), ("three", 3)]
    r = measure_server(url, requests, prompt_tokens=30, reps=2)
    assert r["saturated_failed"] == 0 and r["errors"] == []
    assert abs(r["saturated_output_tok_s"] * r["saturated_seconds"] - 13) < 1e-6  # every token asked for
    assert abs(r["saturated_total_tok_s"] * r["saturated_seconds"] - 43) < 1e-6  # 30 prompt + 13 output tokens
    assert r["single_decode_tok_s"] > 0 and r["single_ttft_s"] > 0
