"""Models beyond full attention through stage 06's engine, on every backend: greedy ids equal
stage 01's whole recompute (which equals transformers) for prompts longer than the windows."""

import pytest
import torch

from course.s01_decode_loop.families.testing import family_model
from course.s01_decode_loop.generate import generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, windowed_model
from course.s04_continuous_batching.hybrid.engine import HybridStates
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

cpu.register()

PROMPTS = [list(range(30, 52)), [5, 6, 7], list(range(60, 75))]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


class HybridEngine(HybridStates, LLMEngine):
    pass


def served(model, byte_tok, **options):
    engine_class = HybridEngine if model.config.model_type == "qwen3_next" else LLMEngine
    config = KernelEngineConfig(num_blocks=48, block_size=4, max_num_seqs=4, max_num_batched_tokens=10, **options)
    engine = engine_class(model, byte_tok, config, [TINY_EOS])
    return [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]


RUNS = [("gemma3_text", "torch", {}), ("gemma3_text", "cpu", {}), ("gemma3_text", "triton", {}),
        ("gpt_oss", "torch", {}), ("gpt_oss", "cpu", {}), ("gpt_oss", "triton", {}),
        ("qwen3_next", "torch", {}), ("qwen3_next", "cpu", {}),
        ("windowed", "torch", {"cuda_graphs": True}), ("windowed", "cpu", {"fused": True})]


@pytest.mark.parametrize("name, backend, options", RUNS, ids=[f"{n}-{b}" for n, b, _ in RUNS])
def test_families_every_backend_gives_stage01_greedy_ids(byte_tok, name, backend, options):
    model = windowed_model(5, every_layer=False) if name == "windowed" else family_model(name)
    want = [generate_naive(model, byte_tok, p, GREEDY).token_ids for p in PROMPTS]
    assert served(model, byte_tok, attention_backend=backend, **options) == want


def test_families_the_torch_backend_refuses_a_tree_with_sinks():
    """Its tree path (SDPA) has no sink term, and stage 03's path does not see trees: refused."""
    from course.s03_paged.paged_attention import PagedKVCache
    from course.s06_kernels_graphs.backend_base import KernelMetadata
    from course.s06_kernels_graphs.engine import BACKENDS

    model = family_model("gpt_oss")
    backend = BACKENDS["torch"](PagedKVCache(model.config, 8, 4))
    zeros = torch.zeros(3, dtype=torch.long)
    meta = KernelMetadata(positions=zeros, cu_seqlens_q=torch.tensor([0, 3]), seq_lens=torch.tensor([3]),
                          slot_mapping=zeros, block_tables=torch.zeros(1, 1, dtype=torch.long), plan=object(),
                          trees={0: torch.ones(3, 3, dtype=torch.bool).tril()})
    q = torch.zeros(3, model.config.num_attention_heads, model.config.head_dim)
    kv = torch.zeros(3, model.config.num_key_value_heads, model.config.head_dim)
    with pytest.raises(ValueError, match="tree with attention sinks"):
        backend.forward(0, q, kv, kv, meta, sinks=torch.zeros(model.config.num_attention_heads))
