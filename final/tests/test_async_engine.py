"""The engine thread behind asyncio: concurrent streams, disconnects, refusals, failures."""
import asyncio
import contextlib
import time

import pytest

from course.final.async_engine import AsyncEngine, EngineDeadError
from course.final.engine import Engine
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.block_manager import NoFreeBlocksError
from course.s04_continuous_batching.engine import LLMEngine, QueueFullError
from course.s06_kernels_graphs.engine import KernelEngineConfig

PROMPTS = [[5] * 3, [6] * 20, [7] * 9, [8] * 14]


def params(n, seed=None):
    return SamplingParams(max_new_tokens=n, temperature=0.8 if seed is not None else 0, seed=seed, ignore_eos=True)


@pytest.fixture
def engine(byte_tok):
    eng = AsyncEngine(Engine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=64, block_size=4,
                                                                             max_waiting=8))).start()
    yield eng
    eng.shutdown()


def wait_until_idle(eng):
    for _ in range(100):
        if eng.call(lambda e: not e.has_unfinished()):
            return
        time.sleep(0.05)
    raise AssertionError("the engine never went idle")


async def collect(eng, prompt, sp):
    return [e.token_id async for e in eng.generate(prompt, sp)]


def test_async_concurrent_streams_equal_offline_engine(engine, byte_tok):
    sps = [params(12), params(5, seed=1), params(9), params(7, seed=2)]

    async def main():
        return await asyncio.gather(*(collect(engine, p, sp) for p, sp in zip(PROMPTS, sps)))
    streamed = asyncio.run(main())
    offline = LLMEngine(tiny_model("gqa_tied"), byte_tok).generate(PROMPTS, sps)
    assert streamed == [o.token_ids for o in offline]


def test_async_consumer_that_stops_early_frees_its_blocks(engine):
    async def main():
        got = []
        async with contextlib.aclosing(engine.generate(PROMPTS[1], params(200))) as stream:
            async for event in stream:
                got.append(event.token_id)
                if len(got) == 2:
                    break  # the client went away: closing the stream aborts the request
        return got
    assert len(asyncio.run(main())) == 2
    wait_until_idle(engine)
    assert engine.call(lambda e: (e.blocks.num_free_blocks, e.blocks.tables, e.requests)) == (64, {}, {})


def test_async_refusals_arrive_before_any_token(engine):
    async def main(prompt, sp):
        return await collect(engine, prompt, sp)
    with pytest.raises(NoFreeBlocksError, match="the pool has 64"):
        asyncio.run(main(list(range(300)), params(100)))


def test_async_queue_full_is_reported(byte_tok):
    eng = AsyncEngine(Engine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(max_waiting=1, max_num_seqs=1)))
    eng.start()
    try:
        async def main():
            results = await asyncio.gather(*(collect(eng, p, params(30)) for p in PROMPTS),
                                           return_exceptions=True)
            return results
        results = asyncio.run(main())
        assert any(isinstance(r, QueueFullError) for r in results)
        assert any(isinstance(r, list) and len(r) == 30 for r in results)  # the others complete
    finally:
        eng.shutdown()


def test_async_engine_failure_fails_requests_not_the_server(engine, monkeypatch):
    real_step, calls = engine.engine.step, []

    def broken_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated kernel failure")
        return real_step()
    monkeypatch.setattr(engine.engine, "step", broken_once)
    with pytest.raises(EngineDeadError, match="simulated kernel failure"):
        asyncio.run(collect(engine, PROMPTS[0], params(5)))
    assert asyncio.run(collect(engine, PROMPTS[2], params(5))) != []  # still serving
    wait_until_idle(engine)
    assert engine.call(lambda e: (e.blocks.num_free_blocks, e.requests)) == (64, {})  # nothing kept


def test_async_engine_survives_a_consumer_whose_loop_closed(engine):
    """A consumer's event loop that vanished mid-request must not kill the engine thread."""
    async def abandon():
        stream = engine.generate(PROMPTS[3], params(200))
        await anext(stream)  # never closed: asyncio.run closes the loop under it
    asyncio.run(abandon())
    wait_until_idle(engine)
    assert asyncio.run(collect(engine, PROMPTS[0], params(4))) != []
    assert engine.call(lambda e: e.blocks.num_free_blocks) == 64


def test_async_metrics_follow_the_engine_under_preemption(byte_tok):
    """A pool too small for everyone forces preemptions; the Prometheus counters must agree
    with the engine's own totals, and every request must be counted once when it ends."""
    eng = AsyncEngine(Engine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=14, block_size=4)))
    eng.start()
    try:
        async def main():
            return await asyncio.gather(*(collect(eng, p, params(24)) for p in PROMPTS))
        assert [len(r) for r in asyncio.run(main())] == [24] * 4
        wait_until_idle(eng)
        eng.call(eng.metrics.engine_updated)  # refresh now, on the engine thread
        engine_preemptions = eng.call(lambda e: e.scheduler.num_preemptions)

        def value(name, **labels):
            return eng.metrics.registry.get_sample_value(name, {"model_name": "model"} | labels)
        assert engine_preemptions > 0 and value("vllm:num_preemptions_total") == engine_preemptions
        assert value("vllm:request_success_total", finished_reason="length") == 4
        assert value("vllm:time_to_first_token_seconds_count") == 4
        assert value("vllm:generation_tokens_total") == 4 * 24
        assert value("vllm:num_requests_running") == 0 and value("vllm:kv_cache_usage_perc") == 0
    finally:
        eng.shutdown()
