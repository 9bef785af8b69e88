"""layer.py: a decoder layer in one C call equals the per-op path it replaces."""
import copy
import sys

import pytest
import torch

from course.s01_decode_loop.testing import tiny_model
from course.s03_paged.paged_attention import PagedKVCache
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.cpu import layer as cpu_layer
from course.s06_kernels_graphs.cpu.backend import CpuPagedBackend
from course.s06_kernels_graphs.cpu.ops import CpuOps
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.cpu.layer import BLOCKED_ROWS, LayerCalls, product
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.fused_model import FusedCausalLM
from course.s06_kernels_graphs.cpu.int8_linear import Int8Linear, quantize_linears, quantize_rows
from course.s06_kernels_graphs.model_runner import ModelRunner
from course.s06_kernels_graphs.cpu.split_linear import split_linears

cpu.register()  # the room's backend and engine options, as the CLI plugs them in

BLOCK, BLOCKS = 4, 60


# rows: one, each block size (1-4), uneven blocks (10 = 4+3+3), the last blocked size, and past it
# (MKL's sgemm for float32); weights: rows and columns off the block (4) and the vector (16)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 10, 17, BLOCKED_ROWS, BLOCKED_ROWS + 1])
@pytest.mark.parametrize("n, k", [(12, 20), (64, 576), (7, 33), (960, 576), (3, 16)])
def test_products_equal_matmul(m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    torch.testing.assert_close(product(x, w), (x.double() @ w.double().T).float(), atol=1e-4, rtol=1e-5)


def int16_rows(x: torch.Tensor):
    """int8.c's rounding of activation rows to int16, in torch: (xq, rscale) with
    x ~= xq * rscale[:, None], the largest magnitude at the limit that keeps k-long int32 sums safe."""
    k = x.shape[1]
    limit = torch.tensor(float(min(32767, (2 ** 31 - 1) // (127 * k))))
    amax = x.abs().amax(dim=1)
    inv = torch.where(amax > 0, limit / amax, 0.0)
    return torch.round(x * inv[:, None]), torch.where(amax > 0, amax / limit, 0.0)


INT8_VNNI = "avx512_vnni" in open("/proc/cpuinfo").read() if sys.platform == "linux" else False
AVX512 = "avx512f" in open("/proc/cpuinfo").read() if sys.platform == "linux" else False


@pytest.mark.parametrize("m", [1, 3, 10, BLOCKED_ROWS + 1])
@pytest.mark.parametrize("n, k", [(12, 20), (7, 33), (960, 576), (5, 1536)])  # k off and on 32
def test_int8_products_equal_the_dequantized_matmul(m, n, k):
    """With VNNI the rows are rounded to int16 first: the product is then exact integer
    arithmetic on the rounded rows (checked tightly), and within 1e-3 of the row's scale of the
    float product (the rounding's cost). Without VNNI it is the float product itself."""
    g = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    q, scale = quantize_rows(w)
    got = product(x, q, scale)
    float_product = x.double() @ (q.double() * scale.double()[:, None]).T
    if not INT8_VNNI:
        torch.testing.assert_close(got, float_product.float(), atol=1e-4, rtol=1e-5)
        return
    xq, rscale = int16_rows(x)
    exact = (xq.double() @ q.double().T) * rscale.double()[:, None] * scale.double()[None, :]
    torch.testing.assert_close(got, exact.float(), atol=1e-5, rtol=1e-5)
    row_scale = float_product.abs().amax(dim=1, keepdim=True)
    assert ((got.double() - float_product).abs() <= 1e-3 * row_scale).all()


@pytest.mark.skipif(not AVX512, reason="the AVX-512 path runs only on a CPU with AVX-512 (the AVX2 one: "
                    "test_the_avx2_path_computes_the_same_products)")
def test_int8_products_without_vnni_widen_to_float():
    """CPUs with AVX-512 but not VNNI multiply int8 weights in float32 (layer.c's blocks): built for
    Skylake-SP (AVX-512, no VNNI) whatever this CPU or $COURSE_CPU_ARCH builds for."""
    _, i8 = products_built_with(["-march=skylake-avx512"])
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(10, 40, generator=g), torch.randn(9, 40, generator=g)
    q, scale = quantize_rows(w)
    want = x.double() @ (q.double() * scale.double()[:, None]).T
    torch.testing.assert_close(i8(x, q, scale), want.float(), atol=1e-4, rtol=1e-5)


def _side(fused, one_call=True, kv_dtype=None):
    """The model beside its own pool and cpu backend (one-call layers on or off), and a runner."""
    cache = PagedKVCache(fused.config, BLOCKS + 1, BLOCK, kv_dtype=kv_dtype)
    attn = CpuPagedBackend(cache, one_call_layers=one_call)
    fused.follow(attn)
    return fused, cache, attn, ModelRunner(fused, attn, max_num_tokens=MAX_TOKENS, max_num_seqs=4,
                                           max_blocks_per_seq=MAX_BLOCKS, dummy_block=BLOCKS)


@pytest.mark.parametrize("name", ["gqa_tied", "mha_untied", "qwen3"])
def test_int8_one_call_layers_equal_the_dequantized_float_model(name, spy):
    """With int8 weights the C layer computes what float32 weights equal to the dequantized
    int8 ones compute (activations float32 between the products; inside them, rounded to int16
    where the CPU has VNNI), lm_head included."""
    model = tiny_model(name, seed=2)
    int8 = quantize_linears(FusedCausalLM(model, ops=CpuOps), parts=1)
    floats = FusedCausalLM(model, ops=CpuOps)
    for path, module in list(int8.named_modules()):
        if isinstance(module, Int8Linear):
            parent, attr = floats.get_submodule(path.rpartition(".")[0]) if "." in path else floats, path.rpartition(".")[2]
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=False)
            linear.weight.data = module.dequantized()  # a new module: a tied embedding keeps its weight
            setattr(parent, attr, linear)
    one_call, per_op = _side(int8), _side(floats, one_call=False)
    for tokens, seqs in STEPS + BIG_STEPS:  # int8 products stay in the blocked kernel at any rows
        torch.testing.assert_close(_step(one_call, tokens, seqs), _step(per_op, tokens, seqs), atol=2e-4, rtol=1e-4)
    assert len(spy) == len(STEPS + BIG_STEPS) * model.config.num_hidden_layers


@pytest.fixture
def spy(monkeypatch):
    """Counts the one-call layers run."""
    calls = []
    run = LayerCalls.run

    def counted(self, layer, x, residual):
        calls.append(layer.layer_idx)
        return run(self, layer, x, residual)
    monkeypatch.setattr(LayerCalls, "run", counted)
    return calls


def _pair(name, splits=2, kv_dtype=None):
    """The fused model with one-call layers and without, same weights, each with its own pool."""
    model = tiny_model(name, seed=1)
    return [_side(split_linears(FusedCausalLM(model, ops=CpuOps), splits), one_call, kv_dtype)
            for one_call in (True, False)]


def _step(side, tokens, seqs):
    fused, _, attn, runner = side
    ids, meta = runner.prepare(tokens, seqs)
    with torch.no_grad():
        return fused.compute_logits(fused(ids, attn, meta))


# (tokens, seqs as (cached, new, blocks)) per step: prompts of 3 and 5 rows, then decodes,
# then a verification run of 4 rows beside a decode, then a chunk of 4 after a cached prefix.
STEPS = [
    ([5, 9, 2], [(0, 3, [0, 1, 2])]),
    ([7, 1, 4, 4, 8], [(0, 5, [3, 4, 5])]),
    ([11, 12], [(3, 1, [0, 1, 2]), (5, 1, [3, 4, 5])]),
    ([13, 14, 15, 16, 17], [(4, 4, [0, 1, 2]), (6, 1, [3, 4, 5])]),
    ([20, 21, 22, 23], [(0, 4, [6, 7]), ]),
    ([24, 25, 26, 27], [(4, 4, [6, 7, 8])]),
]


# a 12-token prompt beside a decode (blocks of 4+3+3+3 rows), then more rows than BLOCKED_ROWS (a
# 66-token prompt beside a decode: float32 products through MKL's sgemm)
BIG_STEPS = [(list(range(30, 43)), [(0, 12, [9, 10, 11]), (8, 1, [6, 7, 8])]),
             (list(range(BLOCKED_ROWS + 3)), [(0, BLOCKED_ROWS + 2, list(range(12, 29))), (9, 1, [6, 7, 8])])]
MAX_TOKENS, MAX_BLOCKS = BLOCKED_ROWS + 3, 17


@pytest.fixture
def gemms_in_c(monkeypatch):
    """Steps of many rows stay in the C layer (its sgemm path), wherever oneDNN would be faster."""
    monkeypatch.setenv("COURSE_MANY_ROWS_PRODUCT", "mkl")


@pytest.mark.parametrize("name", ["gqa_tied", "mha_untied", "mqa_odd_heads", "llama3_rope", "qwen3"])
def test_one_call_layers_equal_the_per_op_path(name, spy, gemms_in_c):
    one_call, per_op = _pair(name)
    assert cpu_layer._torch_sgemm() is not None  # torch's CPU build carries MKL's sgemm_
    for tokens, seqs in STEPS + BIG_STEPS:
        before = len(spy)
        got, want = _step(one_call, tokens, seqs), _step(per_op, tokens, seqs)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
        assert len(spy) - before == one_call[0].config.num_hidden_layers  # the C path ran every layer
    # every K/V the steps wrote is where the per-op path put it
    torch.testing.assert_close(one_call[1].k, per_op[1].k, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(one_call[1].v, per_op[1].v, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.int8, torch.float8_e4m3fn])
def test_one_call_layers_write_and_read_a_stored_pool_as_the_per_op_path(kv_dtype, spy, gemms_in_c):
    """The C layer's KV write rounds or quantizes as stage 03's `quantize` does (a code may
    differ by one where x / scale falls on a rounding tie: the C multiplies by the reciprocal),
    and its attention reads the codes where they lie."""
    one_call, per_op = _pair("gqa_tied", kv_dtype=kv_dtype)
    for tokens, seqs in STEPS + BIG_STEPS:
        torch.testing.assert_close(_step(one_call, tokens, seqs), _step(per_op, tokens, seqs), atol=1e-3, rtol=1e-3)
    assert len(spy) == len(STEPS + BIG_STEPS) * one_call[0].config.num_hidden_layers
    (_, c, *_), (_, t, *_) = one_call, per_op
    if c.quantized:  # scales come from the row's largest value: no rounding ties there
        assert torch.equal(c.k_scale, t.k_scale) and torch.equal(c.v_scale, t.v_scale)
    for got, want in ((c.k, t.k), (c.v, t.v)):
        differ = (got.float() != want.float()).float().mean().item()
        assert differ < 0.01, f"{differ:.1%} of the codes differ"


def test_a_step_of_many_rows_runs_its_gemms_in_onednn_where_chosen(spy, monkeypatch):
    """With oneDNN chosen (onednn.py), a step past BLOCKED_ROWS runs the fused model's own ops,
    whose split linears multiply in oneDNN, and equals the C layer's sgemm step; smaller steps
    stay in the C layer."""
    monkeypatch.setenv("COURSE_MANY_ROWS_PRODUCT", "mkl")
    in_c, _ = _pair("gqa_tied")
    want = [_step(in_c, tokens, seqs) for tokens, seqs in STEPS[:1] + BIG_STEPS]
    layers = in_c[0].config.num_hidden_layers
    assert len(spy) == 3 * layers
    monkeypatch.setenv("COURSE_MANY_ROWS_PRODUCT", "onednn")
    by_ops, _ = _pair("gqa_tied")
    got = [_step(by_ops, tokens, seqs) for tokens, seqs in STEPS[:1] + BIG_STEPS]
    assert len(spy) == 3 * layers + 2 * layers  # the 67-row step: no C layer
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(by_ops[1].k, in_c[1].k, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_what_the_c_does_not_cover_takes_the_per_op_path(spy):
    bias, _ = _pair("qwen2_bias")  # a QKV bias: not in the C layer
    _step(bias, [1, 2, 3], [(0, 3, [0, 1, 2])])
    torch_ops, _ = _pair("gqa_tied")
    torch_backend = make_backend("torch", torch_ops[1])
    runner = ModelRunner(torch_ops[0], torch_backend, max_num_tokens=16, max_num_seqs=4, max_blocks_per_seq=MAX_BLOCKS,
                         dummy_block=BLOCKS)
    _step((torch_ops[0], torch_ops[1], torch_backend, runner), [1, 2], [(0, 2, [0])])
    assert spy == []


def test_a_slot_outside_the_pool_raises_and_writes_nothing():
    side, _ = _pair("gqa_tied")
    fused, cache, attn, runner = side
    ids, meta = runner.prepare([1], [(0, 1, [0])])
    meta.slot_mapping.fill_(10 ** 6)
    before = cache.k.clone()
    with pytest.raises(RuntimeError, match="outside the pool"):
        fused(ids, attn, meta)
    assert torch.equal(cache.k.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize("name", ["gqa_tied", "mqa_odd_heads"])
def test_engine_tokens_are_the_same_with_and_without_one_call_layers(name, byte_tok, spy):
    model = tiny_model(name)
    prompts = [list(b"hello there"), list(b"a"), list(b"0123456789" * 3)]
    from course.s01_decode_loop.sampling import SamplingParams
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = []
    for one_call in (True, False):
        config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=16,
                                    attention_backend="cpu", fused=True, linear_splits=2, one_call_layers=one_call)
        outputs.append([o.token_ids for o in LLMEngine(copy.deepcopy(model), byte_tok, config).generate(prompts, params)])
    assert outputs[0] == outputs[1]
    assert spy  # decode steps of 3 rows ran through the C layer


def test_without_a_blas_the_blocked_kernel_takes_every_step(spy, gemms_in_c):
    """A torch without sgemm_ (no MKL): steps of any size still run in C, all in the blocked kernel."""
    lib = cpu_layer._library()
    lib.set_sgemm(None, BLOCKED_ROWS)
    try:
        one_call, per_op = _pair("gqa_tied")
        for tokens, seqs in STEPS[:1] + BIG_STEPS:
            torch.testing.assert_close(_step(one_call, tokens, seqs), _step(per_op, tokens, seqs), atol=2e-4, rtol=1e-4)
    finally:
        lib.set_sgemm(cpu_layer._torch_sgemm(), BLOCKED_ROWS)
    assert len(spy) == 3 * one_call[0].config.num_hidden_layers


def test_without_a_compiler_the_per_op_path_runs(monkeypatch, spy):
    monkeypatch.setattr(cpu_layer, "layer_kernel_unavailable", lambda: "no C compiler (test)")
    side, _ = _pair("gqa_tied")
    _step(side, [1, 2], [(0, 2, [0])])
    assert spy == []


@pytest.mark.slow
def test_default_model_one_call_layers_give_the_same_greedy_tokens(smollm2):
    from course.s01_decode_loop.sampling import SamplingParams
    prompts = [smollm2.tokenizer.encode(p) for p in ["The capital of France is", "def fib(n):"]]
    params = SamplingParams(max_new_tokens=32, temperature=0.0)
    outputs = []
    for one_call in (True, False):
        config = KernelEngineConfig(num_blocks=64, attention_backend="cpu", fused=True, linear_splits=2,
                                    one_call_layers=one_call)
        engine = LLMEngine(smollm2.model, smollm2.tokenizer, config, smollm2.eos_token_ids)
        outputs.append([o.token_ids for o in engine.generate(prompts, params)])
    assert outputs[0] == outputs[1]


def products_built_with(flags: list[str]):
    """product_f32 and product_i8_f32 of layer.c compiled with `flags` added, as torch functions."""
    import ctypes

    from course.s06_kernels_graphs.cpu import native
    lib = native.load(cpu_layer.SOURCE, cpu_layer.FLAGS + flags)
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.product_f32.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.product_i8_f32.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]

    def f32(x, w):
        out = torch.empty(x.shape[0], w.shape[0])
        lib.product_f32(x.data_ptr(), w.data_ptr(), out.data_ptr(), *x.shape[:1], w.shape[0], x.shape[1], 2)
        return out

    def i8(x, q, scale):
        out = torch.empty(x.shape[0], q.shape[0])
        lib.product_i8_f32(x.data_ptr(), q.data_ptr(), scale.data_ptr(), out.data_ptr(), x.shape[0], q.shape[0],
                           x.shape[1], 2)
        return out
    return f32, i8


def test_the_portable_c_without_vector_units_computes_the_same_products():
    """Machines with neither AVX-512 nor AVX2 compile the plain-C loops instead (-DPLAIN_LOOPS
    builds them anywhere): same results."""
    f32, i8 = products_built_with(["-DPLAIN_LOOPS"])
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 37, generator=g), torch.randn(10, 37, generator=g)  # two row blocks, a weight tail
    q, scale = quantize_rows(w)
    torch.testing.assert_close(f32(x, w), (x.double() @ w.double().T).float(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(i8(x, q, scale), (x.double() @ (q.double() * scale.double()[:, None]).T).float(),
                               atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 10])
@pytest.mark.parametrize("n, k", [(12, 20), (7, 33), (960, 576), (5, 1536), (9, 16)])  # k off and on 8 and 16
def test_the_avx2_path_computes_the_same_products(m, n, k):
    """The Zen 3 hosts' build (-march=haswell: AVX2 + FMA): float products in 8-wide blocks equal
    the matmul; int8 ones are vpmaddwd's exact integer sums on the rows rounded to int16, the
    same arithmetic as the VNNI path."""
    f32, i8 = products_built_with(["-march=haswell"])
    g = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    torch.testing.assert_close(f32(x, w), (x.double() @ w.double().T).float(), atol=1e-4, rtol=1e-5)
    q, scale = quantize_rows(w)
    xq, rscale = int16_rows(x)
    exact = (xq.double() @ q.double().T) * rscale.double()[:, None] * scale.double()[None, :]
    torch.testing.assert_close(i8(x, q, scale), exact.float(), atol=1e-5, rtol=1e-5)
