"""Each MoE family through stage 06's engine, with each backend's experts kernel (the model's
own grouped experts eager, the gpu room's blocked ones inside captured steps, the C products,
the gpu room's fused Triton kernel under the interpreter), under preemption and chunked
prefill: transformers' greedy ids."""
import pytest

from course.s01_decode_loop.moe.testing import MOE_FAMILIES, tiny_moe_model
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, greedy_reference, hf_twin
from course.s06_kernels_graphs import cpu, gpu
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

cpu.register()  # the cpu backend (the C products)
gpu.register()  # the blocked experts of captured steps, the fused MoE kernel

PROMPTS = [b"You are a helpful assistant. hi", b"a", b"0123456789abcdefghij"]
BACKENDS = {"torch-fused-graphs": dict(attention_backend="torch", fused=True, cuda_graphs=True),
            "cpu": dict(attention_backend="cpu", fused=True),
            "triton-gpu": dict(attention_backend="triton", fused=True, triton_kernels="gpu")}
# every family with the blocked experts of captured steps and the C products; the fused Triton
# kernel (under the interpreter: slow) on one
RUNS = [(family, backend) for family in MOE_FAMILIES for backend in ("torch-fused-graphs", "cpu")] + \
    [(MOE_FAMILIES[0], "triton-gpu")]


@pytest.mark.parametrize("family, backend", RUNS, ids=[f"{f}-{b}" for f, b in RUNS])
def test_moe_engine_every_backend_gives_transformers_greedy_ids(byte_tok, family, backend):
    model = tiny_moe_model(family)
    hf = hf_twin(model)
    config = KernelEngineConfig(block_size=4, max_num_seqs=3, max_num_batched_tokens=7, num_blocks=14,
                                **BACKENDS[backend])
    engine = LLMEngine(model, byte_tok, config, [TINY_EOS])
    outs = engine.generate([list(p) for p in PROMPTS], [SamplingParams(max_new_tokens=8, temperature=0,
                                                                       ignore_eos=True)] * len(PROMPTS))
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == greedy_reference(hf, list(prompt), 8)[0]
