"""Stage 06's engine gives stage 04's tokens, whatever the backend, graphs or fused kernels.

The workloads force every kind of step: prompts longer than the token budget (chunked
prefill, so prefill chunks and decodes share steps), a shared prefix (prefix-cache hits: a
chunk whose first keys are already cached), and a pool small enough to preempt."""
import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_CONFIGS, TINY_EOS, tiny_model
from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine
from course.s06_kernels_graphs import cpu, gpu, int8_kv, mixed_graphs
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.fused_model import FusedCausalLM
from course.s06_kernels_graphs.gpu.kernel_set import GpuKernels
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.triton_backend import TritonPagedBackend

cpu.register()  # the cpu backend and the linear options
gpu.register()  # the "gpu" kernel set
mixed_graphs.register()  # with graphs, steps with prefill chunks replay token buckets too
int8_kv.register()  # the Triton backend's write into an int8 pool

SHARED = b"You are a helpful assistant. "
PROMPTS = [SHARED + b"hi", b"a", SHARED + b"tell me about the sea", b"0123456789abcdefghij", b"xyz"]
POOLS = {"roomy": dict(num_blocks=64), "tight": dict(num_blocks=24)}  # tight: preemption happens


def run(engine_cls, config, model, tok, params):
    engine = engine_cls(model, tok, config, [TINY_EOS])
    outputs = engine.generate([list(p) for p in PROMPTS], params)
    return [o.token_ids for o in outputs], engine


def stage04(model, tok, params, pool, kv_cache_dtype="auto"):
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=12, **POOLS[pool],
                          kv_cache_dtype=kv_cache_dtype)
    return run(BatchingEngine, config, model, tok, params)[0]


def stage06(model, tok, params, pool, **options):
    config = KernelEngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=12, **POOLS[pool], **options)
    return run(LLMEngine, config, model, tok, params)


GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)


# Every family once on the hardest path (a tight pool, fused and split linears, graphs), and one
# family through the other settings: graphs or not, fused or not, the pool roomy or tight.
TORCH_RUNS = [(name, "tight", True, True, 2) for name in sorted(TINY_CONFIGS)] + [
    ("gqa_tied", "roomy", False, False, 1), ("gqa_tied", "roomy", False, True, 1), ("gqa_tied", "tight", False, False, 1),
    ("gqa_tied", "roomy", True, False, 1), ("mqa_odd_heads", "tight", False, True, 1)]


@pytest.mark.parametrize("name, pool, graphs, fused, splits", TORCH_RUNS, ids=[
    f"{n}-{p}-{'graphs' if g else 'eager'}-{'fused' if f else 'unfused'}{'-split' if s > 1 else ''}"
    for n, p, g, f, s in TORCH_RUNS])
def test_torch_backend_gives_stage04_greedy_tokens(byte_tok, name, pool, graphs, fused, splits):
    model = tiny_model(name)
    want = stage04(model, byte_tok, GREEDY, pool)
    got, engine = stage06(model, byte_tok, GREEDY, pool, cuda_graphs=graphs, fused=fused, linear_splits=splits)
    assert got == want
    assert (engine.graphed_steps > 0) == graphs
    if pool == "tight":
        assert engine.stats()["preemptions"] > 0  # the workload did what it is here for


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_the_lessons_torch_backend_gives_stage04_greedy_tokens(byte_tok, monkeypatch, graphs):
    """The lesson alone: its eager paths (the gather for decodes, stage 03's for chunks) where
    the CPU room has not put its planned steps in their place, and its decode graphs where the
    mixed_graphs room has not added token buckets."""
    from course.s06_kernels_graphs import engine as engine_module
    from course.s06_kernels_graphs.graph_runner import GraphRunner
    from course.s06_kernels_graphs.torch_backend import TorchPagedBackend

    monkeypatch.setitem(engine_module.BACKENDS, "torch", TorchPagedBackend)
    monkeypatch.delitem(engine_module.EXTENSIONS, "mixed_graphs")
    model = tiny_model("qwen3")
    got, engine = stage06(model, byte_tok, GREEDY, "tight", cuda_graphs=graphs, fused=graphs)
    assert got == stage04(model, byte_tok, GREEDY, "tight") and type(engine.attn) is TorchPagedBackend
    if graphs:
        decodes = sum(1 for s in engine.step_log if all(n == 1 for _, n, _ in s["chunks"]))
        assert type(engine.runner.graphs) is GraphRunner and 0 < engine.graphed_steps <= decodes


CPU_RUNS = [(name, "tight", 40, True) for name in sorted(TINY_CONFIGS)] + [("gqa_tied", "roomy", 12, False),
                                                                             ("mqa_odd_heads", "tight", 12, False)]


@pytest.mark.parametrize("name, pool, budget, fused", CPU_RUNS,  # budget 40: whole prompts in one chunk beside decodes
                         ids=[f"{n}-{p}-{b}-{'fused-split' if f else 'unfused'}" for n, p, b, f in CPU_RUNS])
def test_cpu_backend_gives_stage04_greedy_tokens(byte_tok, name, pool, budget, fused):
    model = tiny_model(name)
    want = stage04(model, byte_tok, GREEDY, pool)
    config = KernelEngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=budget, **POOLS[pool],
                                attention_backend="cpu", fused=fused, linear_splits=2 if fused else 1)
    got, engine = run(LLMEngine, config, model, byte_tok, GREEDY)
    assert got == want and engine.stats()["backend"] == "cpu"
    if budget == 40:
        assert any(n > 12 for s in engine.step_log for _, n, _ in s["chunks"])  # chunks of more than 12 rows


STORED_RUNS = [(kv, backend, graphs) for kv in ("bfloat16", "int8", "fp8")
               for backend, graphs in (("cpu", False), ("torch", True))] + [("int8", "triton", False)]


@pytest.mark.parametrize("kv_cache_dtype, backend, graphs", STORED_RUNS,
                         ids=[f"{kv}-{b}{'-graphs' if g else ''}" for kv, b, g in STORED_RUNS])
def test_a_stored_kv_cache_gives_stage04s_tokens_with_the_same_cache(byte_tok, kv_cache_dtype, backend, graphs):
    """bfloat16 values or int8/fp8 codes and scales, written and read by every path (the C
    layer's write and attention, the graphs' gather, chunked prefill, prefix hits, preemption):
    the tokens stage 04's reference computes from the same kind of pool."""
    model = tiny_model("gqa_tied")
    want = stage04(model, byte_tok, GREEDY, "tight", kv_cache_dtype)
    got, engine = stage06(model, byte_tok, GREEDY, "tight", attention_backend=backend, fused=True,
                          cuda_graphs=graphs, kv_cache_dtype=kv_cache_dtype)
    assert got == want and engine.stats()["preemptions"] > 0
    assert engine.cache.k.dtype == {"bfloat16": torch.bfloat16, "int8": torch.int8, "fp8": torch.float8_e4m3fn}[kv_cache_dtype]


@pytest.mark.parametrize("kv_cache_dtype, kernels", [("fp8", "lesson"), ("int8", "gpu")])
def test_a_backend_refuses_a_stored_cache_it_cannot_read_by_name(byte_tok, kv_cache_dtype, kernels):
    with pytest.raises(ValueError, match="triton backend reads K/V pools of the model's dtype.*torch and cpu"):
        stage06(tiny_model("gqa_tied"), byte_tok, GREEDY, "roomy", attention_backend="triton",
                triton_kernels=kernels, kv_cache_dtype=kv_cache_dtype)


def test_seeded_sampling_is_unchanged_by_graphs_and_fusion(byte_tok):
    model = tiny_model("gqa_tied")
    params = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.9, seed=7)
    want = stage04(model, byte_tok, params, "roomy")
    got, _ = stage06(model, byte_tok, params, "roomy", cuda_graphs=True, fused=True)
    assert got == want


def test_steps_mix_prefill_chunks_with_decodes(byte_tok):
    """The workload above is only a test of mixed steps if such steps happen."""
    _, engine = stage06(tiny_model("gqa_tied"), byte_tok, GREEDY, "roomy")
    mixed = [s for s in engine.step_log if len({n > 1 for _, n, _ in s["chunks"]}) == 2]
    cached_chunk = [s for s in engine.step_log if any(n > 1 and done > 0 for _, n, done in s["chunks"])]
    assert mixed and cached_chunk


def test_graphs_skip_contexts_longer_than_captured(byte_tok):
    model = tiny_model("gqa_tied")
    want = stage04(model, byte_tok, GREEDY, "roomy")
    got, engine = stage06(model, byte_tok, GREEDY, "roomy", cuda_graphs=True, graph_max_seq_len=24)
    assert got == want
    total_decodes = sum(1 for s in engine.step_log if all(n == 1 for _, n, _ in s["chunks"]))
    assert 0 < engine.graphed_steps < total_decodes  # the long prompts' decodes ran eagerly


def test_runner_returns_hidden_states_of_every_row(byte_tok):
    model = tiny_model("gqa_tied")
    engine = LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=16, block_size=4), [TINY_EOS])
    out = engine.runner.run([1, 2, 3, 4, 5], [(0, 3, [0]), (0, 2, [1])], sample_rows=[2, 4])
    assert out.hidden.shape == (5, model.config.hidden_size) and out.logits.shape == (2, model.config.vocab_size)
    torch.testing.assert_close(out.logits, model.compute_logits(out.hidden[[2, 4]]))


# ---- the Triton backend, through the interpreter (slow: two configs, short outputs) ----------
TRITON_RUNS = [("gqa_tied", False, "lesson"), ("mqa_odd_heads", False, "lesson"), ("qwen3", True, "lesson"),
               ("llama3_rope", False, "gpu"), ("qwen2_bias", True, "gpu")]


@pytest.mark.parametrize("name, graphs, kernels", TRITON_RUNS,
                         ids=[f"{n}-{'graphs' if g else 'eager'}-{k}" for n, g, k in TRITON_RUNS])
def test_triton_backend_gives_stage04_greedy_tokens(byte_tok, monkeypatch, name, graphs, kernels):
    """Both kernel sets, eager and graphed. With graphs every step replays one: the token
    budget (12) fits the largest token bucket (mixed_graphs/), so prefill steps are captured too."""
    model = tiny_model(name)
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    want = stage04(model, byte_tok, params, "roomy")
    graphed, run = [], ModelRunner.run
    monkeypatch.setattr(ModelRunner, "run", lambda self, *a: graphed.append((out := run(self, *a)).graphed) or out)
    folded, fold = [], GpuKernels.rotary_write_kv
    monkeypatch.setattr(GpuKernels, "rotary_write_kv", staticmethod(lambda *a: folded.append(1) or fold(*a)))
    got, engine = stage06(model, byte_tok, params, "roomy", attention_backend="triton", cuda_graphs=graphs,
                          fused=graphs, triton_kernels=kernels)  # fused Triton kernels ride along with graphs
    assert got == want
    assert bool(folded) == (graphs and kernels == "gpu")  # the gpu set folds RoPE into the KV write (fused model)
    assert engine.stats()["backend"] == "triton"
    assert all(graphed) if graphs else not any(graphed)


@pytest.mark.parametrize("kernels, per_layer", [("lesson", ["apply_rotary_", "write_kv", "silu_mul"]),
                                                ("gpu", ["rotary_write_kv", "silu_mul"])])
def test_fused_triton_layer_launches_each_small_kernel_once(monkeypatch, kernels, per_layer):
    """Counted per decode step: each layer launches RoPE, the KV write and silu_mul once (the gpu
    set: RoPE and the KV write in one launch), and never torch's silu."""
    from course.s03_paged.paged_attention import PagedKVCache
    from course.s06_kernels_graphs import kv_write, rotary, silu_mul

    calls = []
    for owner, name in ((rotary, "apply_rotary_"), (kv_write, "write_kv"), (GpuKernels, "rotary_write_kv"),
                        (silu_mul, "silu_mul"), (torch.nn.functional, "silu")):
        counted = lambda *a, _f=getattr(owner, name), _n=name, **kw: calls.append(_n) or _f(*a, **kw)  # noqa: E731
        monkeypatch.setattr(owner, name, staticmethod(counted) if owner is GpuKernels else counted)
    model = tiny_model("gqa_tied")
    backend = TritonPagedBackend(PagedKVCache(model.config, 9, 16), kernels=kernels)
    fused = FusedCausalLM(model).follow(backend)
    ModelRunner(fused, backend, max_num_tokens=1, max_num_seqs=1, max_blocks_per_seq=8, dummy_block=8).run(
        [1], [(20, 1, list(range(8)))], [0])
    assert sorted(calls) == sorted(per_layer * model.config.num_hidden_layers)


def test_triton_split_k_decode_gives_the_same_tokens(byte_tok):
    model = tiny_model("mqa_odd_heads")
    params = SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True)
    want = stage04(model, byte_tok, params, "roomy")
    got, _ = stage06(model, byte_tok, params, "roomy", attention_backend="triton", num_splits=3)
    assert got == want


def test_an_unknown_backend_fails_at_construction(byte_tok):
    with pytest.raises(ValueError, match="backend"):
        LLMEngine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=8, attention_backend="nope"))


def test_room_options_are_refused_until_their_room_registers(byte_tok, monkeypatch):
    """A backend, kernel set or option a room brings exists only once the room registered it."""
    from course.s06_kernels_graphs import engine, triton_backend

    monkeypatch.setattr(engine, "BACKENDS", {k: v for k, v in engine.BACKENDS.items() if k != "cpu"})
    monkeypatch.setattr(triton_backend, "KERNEL_SETS", {"lesson": triton_backend.LessonKernels})
    monkeypatch.setattr(engine, "EXTENSIONS", {})
    model = tiny_model("gqa_tied")
    for options, refusal in [({"attention_backend": "cpu"}, "unknown attention backend"),
                             ({"attention_backend": "triton", "triton_kernels": "gpu"}, "unknown triton kernels"),
                             ({"overlap": True}, "overlap room"), ({"fused": True, "linear_splits": 2}, "cpu room"),
                             ({"cuda_graphs": True, "graph_max_num_tokens": 64}, "mixed_graphs room")]:
        with pytest.raises(ValueError, match=refusal):
            LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=8, **options))
    assert LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=8, fused=True)).extensions == {}


@pytest.mark.parametrize("options, linear", [({}, "Linear"), ({"linear_splits": 2}, "SplitLinear"),
                                             ({"linear_splits": 2, "quantization": "int8"}, "Int8Linear")])
def test_prepare_module_gives_an_extra_module_the_targets_linears(byte_tok, options, linear):
    """What the CPU room's options do to the fused model's linears, `prepare_module` does to
    another module (a draft head); with no option set, the module comes back untouched."""
    engine = LLMEngine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=8, fused=True, **options))
    head = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    assert engine.prepare_module(head) is head
    assert [type(m).__name__ for m in (head[0], head[2], engine.runner.model.layers[0].qkv)] == [linear] * 3


@pytest.mark.parametrize("options, linear", [({}, "Linear"), ({"linear_splits": 2}, "Int8Linear"),
                                             ({"linear_splits": 2, "quantization": "int8"}, "Int8Linear")])
def test_a_draft_module_gets_int8_linears_wherever_the_cpu_room_runs(byte_tok, options, linear):
    """A draft head's outputs are guesses the target verifies: where the CPU room's linear options
    are on, it stores a draft's linears in int8 even when the target's stay float32."""
    engine = LLMEngine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=8, fused=True, **options))
    head = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    x = torch.randn(3, 64)
    want = head(x)
    assert engine.prepare_module(head, draft=True) is head
    assert [type(m).__name__ for m in (head[0], head[2])] == [linear] * 2
    assert (head(x) - want).abs().max() <= 0.05 * want.abs().max()  # int8's error: small, not zero


def record_taps(engine, model, layers):
    """The layers `model` taps (EAGLE-3's drafter reads them), recorded after every step's forward."""
    model.tap_layers, steps, run = layers, [], engine._run

    def recording(*args, **kwargs):
        out = run(*args, **kwargs)
        steps.append(model.tapped.clone())
        return out
    engine._run = recording
    return steps


@pytest.mark.parametrize("options", [dict(fused=True), dict(attention_backend="cpu", fused=True),
                                     dict(attention_backend="cpu", fused=True, cuda_graphs=True)],
                         ids=["torch-fused", "cpu-one-call-layers", "cpu-graphs"])
def test_every_path_taps_the_layers_stage01s_model_taps(byte_tok, options):
    """The fused copy (its residual stream kept apart), the C one-call layers and graph replays
    hand a drafter the same layer outputs as stage 01's model, step for step."""
    model = tiny_model("mqa_odd_heads")
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=12, **POOLS["roomy"])
    want_engine = BatchingEngine(model, byte_tok, config, [TINY_EOS])
    want = record_taps(want_engine, model, (0, 2))
    want_engine.generate([list(p) for p in PROMPTS], GREEDY)
    model.tap_layers = ()
    engine = LLMEngine(model, byte_tok, KernelEngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=12,
                                                           **POOLS["roomy"], **options), [TINY_EOS])
    got = record_taps(engine, engine.runner.model, (0, 2))
    engine.generate([list(p) for p in PROMPTS], GREEDY)
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.shape == (b.shape[0], 2 * model.config.hidden_size)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {step}")
