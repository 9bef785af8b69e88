"""A speculative tree verified inside a batched step (the runner's `trees`), through each backend
that attends trees, against stage 05's tree verification on a contiguous cache."""
import pytest
import torch

from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache
from course.s02_kv_cache.generate import step_metadata
from course.s03_paged.paged_attention import PagedKVCache
from course.s05_speculative.tree import Tree, TreeAttention, block_metadata
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.cpu.backend import CpuPagedBackend
from course.s06_kernels_graphs.cpu.ops import CpuOps
from course.s06_kernels_graphs.cpu.split_linear import split_linears
from course.s06_kernels_graphs.engine import make_backend
from course.s06_kernels_graphs.fused_model import FusedCausalLM
from course.s06_kernels_graphs.model_runner import ModelRunner

cpu.register()
BLOCK, BLOCKS = 4, 40


def a_tree() -> Tree:
    """Eight nodes, three levels: siblings at every level (shared positions), one deep path."""
    tree = Tree()
    a, b = tree.add(11, -1), tree.add(12, -1)
    c, d = tree.add(13, a), tree.add(14, a)
    tree.add(15, b)
    e = tree.add(16, c)
    tree.add(17, c), tree.add(18, e)
    return tree


def stage05_tree_hidden(model, prompt: list[int], tree: Tree) -> torch.Tensor:
    """Stage 05's way: the prompt but its last token cached, then [last, nodes] in one block."""
    cache = KVCache(model.config, 64, model.dtype, model.device)
    with torch.no_grad():
        model(torch.tensor(prompt[:-1]), ContiguousKVAttention(cache), step_metadata(0, len(prompt) - 1, "cpu"))
        start = cache.num_tokens
        ids = torch.tensor([prompt[-1]] + tree.tokens)
        return model(ids, TreeAttention(cache, start, tree.block_mask()),
                     block_metadata(start, [start] + [start + d for d in tree.depths], "cpu"))


@pytest.mark.parametrize("backend, one_call", [("cpu", True), ("cpu", False), ("torch", False)])
@pytest.mark.parametrize("name", ["gqa_tied", "qwen3"])
def test_a_tree_in_a_batched_step_is_verified_as_stage05_verifies_it(name, backend, one_call):
    """Its rows' hidden states equal stage 05's, with a plain decode and a prefill chunk beside it
    in the same step (neither changed by the tree)."""
    model = tiny_model(name, seed=3)
    fused = split_linears(FusedCausalLM(model, ops=CpuOps), 2)
    cache = PagedKVCache(fused.config, BLOCKS + 1, BLOCK)
    attn = make_backend(backend, cache) if backend == "torch" else CpuPagedBackend(cache, one_call_layers=one_call)
    assert attn.tree_masks
    fused.follow(attn)
    runner = ModelRunner(fused, attn, max_num_tokens=64, max_num_seqs=4, max_blocks_per_seq=10, dummy_block=BLOCKS)
    prompt, other, tree = [5, 9, 2, 7, 1, 4, 30], [3, 8, 8, 6, 2], a_tree()
    run = lambda *a, **k: runner.run(*a, **k).hidden  # noqa: E731
    run(prompt[:-1] + other[:-1], [(0, 6, [0, 1]), (0, 4, [2, 3])], [])  # both prompts but their last tokens
    hidden = run([prompt[-1]] + tree.tokens + [other[-1]] + [40, 41, 42],
                 [(6, 1 + len(tree), [0, 1, 4]), (4, 4, [2, 3, 5])], [],
                 trees={0: ([0] + tree.depths, tree.block_mask())})
    want = stage05_tree_hidden(model, prompt, tree)
    torch.testing.assert_close(hidden[:1 + len(tree)], want, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # the chunk beside it: plain causal attention
        alone = model(torch.tensor(other + [40, 41, 42]), ContiguousKVAttention(KVCache(model.config, 64, model.dtype)),
                      step_metadata(0, 8, "cpu"))
    torch.testing.assert_close(hidden[1 + len(tree):], alone[4:], atol=1e-4, rtol=1e-4)


def test_a_backend_without_tree_masks_refuses_a_tree():
    from course.s06_kernels_graphs.torch_backend import TorchPagedBackend

    model = tiny_model("gqa_tied")
    cache = PagedKVCache(model.config, BLOCKS + 1, BLOCK)
    runner = ModelRunner(model, TorchPagedBackend(cache), max_num_tokens=16, max_num_seqs=2, max_blocks_per_seq=4,
                         dummy_block=BLOCKS)
    with pytest.raises(ValueError, match="does not attend speculative trees"):
        runner.run([1, 2, 3], [(0, 3, [0])], [], trees={0: ([0, 1, 1], torch.ones(3, 3, dtype=torch.bool).tril())})
