"""The NCCL path (skipped without a CUDA GPU): world size 1 on one card (the group, the broadcast
and the sharded forward on CUDA), and, where the machine has two or more cards, TP over all of them;
greedy tokens equal the TP=1 engine's on the same card."""
import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s07_disaggregated.tensor_parallel.launch import TensorParallel, TPSpec
from course.s07_disaggregated.tensor_parallel.testing import save_tp_tiny, tp_engine

PROMPTS = [list(range(40, 40 + n)) for n in (5, 13, 30)]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    return save_tp_tiny(byte_tok, tmp_path_factory.mktemp("tp_gpu"))


def cuda_reference(folder):
    from course.s01_decode_loop.weights import load_model
    from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine

    loaded = load_model(folder, device="cuda")
    return LLMEngine(loaded.model, loaded.tokenizer, KernelEngineConfig(num_blocks=64, block_size=4),
                     loaded.eos_token_ids).generate(PROMPTS, GREEDY)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_nccl_group_gives_the_tp1_tokens(folder, world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    want = [o.token_ids for o in cuda_reference(folder)]
    with TensorParallel.start(TPSpec(world, str(folder), device="cuda", timeout_s=120)) as tp:
        loaded, model = tp.load_shard()
        assert model.device.type == "cuda"
        engine = tp_engine(tp, loaded, model, num_blocks=64, block_size=4)
        got = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    assert got == want
