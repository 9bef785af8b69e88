"""What `serve` picks on a GPU, proven on the CPU: the device and dtype `auto` choose, the KV pool
sized from a fake card's memory, every graph bucket captured before the first request, and the
graphs' bounds from the model's context and the flags."""
import pytest
import torch

from course.final.cli import build_server, main, make_parser
from course.final.launch.kv_pool import num_kv_blocks
from course.final.launch.kernel_defaults import pick_device, pick_dtype
from course.final.launch.kv_pool import DEFAULT_BLOCKS, blocks_for_memory
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.kv_size import kv_bytes_per_token

GiB = 2**30


def serve_args(*flags):
    parser, _ = make_parser()
    return parser.parse_args(["serve", *flags])


def fake_card(total: int, in_use: int):
    return lambda: (total - in_use, total)  # torch.cuda.mem_get_info's (free, total)


@pytest.mark.parametrize("name,cuda,want", [("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"),
                                            ("cuda:1", False, "cuda:1")])
def test_device_auto_is_cuda_when_torch_sees_a_card(name, cuda, want):
    assert pick_device(name, cuda_available=lambda: cuda) == want


@pytest.mark.parametrize("name,device,want", [("auto", "cuda", torch.bfloat16), ("auto", "cuda:0", torch.bfloat16),
                                              ("auto", "cpu", torch.float32), ("float16", "cuda", torch.float16),
                                              ("bfloat16", "cpu", torch.bfloat16)])
def test_dtype_auto_is_bfloat16_on_cuda_and_float32_on_the_cpu(name, device, want):
    assert pick_dtype(name, device) == want


def test_serve_defaults_are_auto_and_explicit_flags_stay():
    args = serve_args()
    assert (args.device, args.dtype, args.kv_blocks, args.gpu_memory_utilization) == ("auto", "auto", None, 0.9)
    assert (args.graph_max_seq_len, args.graph_max_num_tokens) == (None, 512)
    args = serve_args("--device", "cpu", "--dtype", "bfloat16", "--kv-blocks", "64")
    assert (args.device, args.dtype, args.kv_blocks) == ("cpu", "bfloat16", 64)


@pytest.mark.parametrize("total,in_use,utilization", [(80 * GiB, 3 * GiB, 0.9), (24 * GiB, 10 * GiB, 0.5),
                                                      (16 * GiB, 0, 1.0)])
def test_the_memory_sized_pool_never_exceeds_its_budget(total, in_use, utilization):
    per_block, reserve = 16 * 32768, GiB
    blocks = blocks_for_memory(per_block, utilization, reserve, reserved_blocks=1,
                               memory_info=fake_card(total, in_use))
    pool = (blocks + 1) * per_block  # the engine allocates one dummy block more
    budget = utilization * total - in_use - reserve
    assert pool <= budget < pool + per_block  # as many blocks as fit, not one more


@pytest.mark.parametrize("total,in_use,utilization", [(8 * GiB, 7 * GiB, 0.9), (80 * GiB, 0, 0.01)])
def test_too_little_memory_is_a_clear_error(total, in_use, utilization):
    with pytest.raises(ValueError, match="not one block.*--gpu-memory-utilization"):
        blocks_for_memory(2**20, utilization, GiB, memory_info=fake_card(total, in_use))


def test_cuda_sizes_the_pool_from_memory_and_explicit_sizes_win():
    config = tiny_model("gqa_tied", seed=0).config
    per_block = 16 * kv_bytes_per_token(config, torch.bfloat16)
    card = fake_card(4 * GiB, GiB)
    blocks = num_kv_blocks(serve_args(), None, config, torch.bfloat16, "cuda", card)
    assert blocks > DEFAULT_BLOCKS and (blocks + 1) * per_block <= 0.9 * 4 * GiB - GiB
    assert num_kv_blocks(serve_args("--gpu-memory-utilization", "0.5"), None, config, torch.bfloat16, "cuda",
                         card) < blocks
    assert num_kv_blocks(serve_args("--kv-blocks", "40"), None, config, torch.bfloat16, "cuda", card) == 40
    assert num_kv_blocks(serve_args("--kv-memory", "1MiB"), 2**20, config, torch.bfloat16, "cuda",
                         card) == 2**20 // per_block
    assert num_kv_blocks(serve_args(), None, config, torch.float32, "cpu") == DEFAULT_BLOCKS  # no query on the CPU


def test_the_pool_is_sized_by_head_dim_not_hidden_over_heads():
    """Qwen3-0.6B's shape: 16 query heads of 128 over a hidden size of 1,024 (not 64 each), 8 KV
    heads, 28 layers: 2 x 28 x 8 x 128 x 2 bytes = 112 KiB a token in bf16, and the step's reserve
    counts the QKV output, 4,096 wide."""
    from transformers import Qwen3Config

    from course.final.launch.kv_pool import step_reserve
    from course.s01_decode_loop.config import ModelConfig

    config = ModelConfig.from_hf(Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                             num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                             head_dim=128))
    assert kv_bytes_per_token(config, torch.bfloat16) == 112 * 1024
    assert num_kv_blocks(serve_args("--kv-memory", "112MiB"), 112 * 2**20, config, torch.bfloat16, "cuda",
                         fake_card(4 * GiB, GiB)) == 1024 // 16
    hidden_over_heads = ModelConfig.from_hf({**config.to_hf(), "head_dim": 64})
    wider = step_reserve(config, 100, torch.bfloat16) - step_reserve(hidden_over_heads, 100, torch.bfloat16)
    assert wider == 2 * 100 * (4096 - 2048) * 2  # twice over, 100 rows, the QKV outputs' widths, bf16


def test_start_up_captures_every_graph_bucket_before_the_first_request(tiny_folder, capsys):
    args = serve_args("--model", str(tiny_folder), "--device", "cpu", "--cuda-graphs", "--kv-blocks", "64",
                      "--max-num-seqs", "8", "--max-num-batched-tokens", "64")
    engine, _ = build_server(args)
    graphs = engine.engine.runner.graphs
    assert graphs.buckets == [1, 2, 4, 8] and graphs.token_buckets == [16, 32, 64]
    assert len(graphs.graphs) + len(graphs.mixed_graphs) == 7  # before any request
    err = capsys.readouterr().err
    assert "capturing graphs: 4 decode + 3 mixed buckets" in err and "done in" in err
    assert "KV cache: 64 blocks of 16 tokens" in err and "device cpu, float32" in err
    assert graphs.max_seq_len == min(engine.engine.max_model_len, 64 * 16)
    held = {**graphs.graphs}, {**graphs.mixed_graphs}
    engine.engine.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True))
    assert engine.engine.graphed_steps > 0 and (graphs.graphs, graphs.mixed_graphs) == held  # replayed, none captured


def test_graph_bounds_follow_the_flags(tiny_folder, capsys):
    args = serve_args("--model", str(tiny_folder), "--device", "cpu", "--cuda-graphs", "--kv-blocks", "64",
                      "--max-num-seqs", "2", "--graph-max-seq-len", "48", "--graph-max-num-tokens", "0")
    engine, _ = build_server(args)
    graphs = engine.engine.runner.graphs
    assert graphs.max_seq_len == 48 and graphs.token_buckets == [] and len(graphs.graphs) == 2


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8", "bfloat16"])
def test_kv_cache_dtype_buys_the_tokens_its_bytes_hold(tiny_folder, capsys, kv_cache_dtype):
    """The same --kv-memory holds as many more blocks as the stored K/V is smaller (int8 and fp8
    codes with their scales: 4 d / (d + 2) times float32's, d the head dim), and says so at start."""
    from course.s03_paged.quantized_kv import KV_CACHE_DTYPES, pool_bytes_per_token

    blocks = {}
    for kv in ("auto", kv_cache_dtype):
        engine, _ = build_server(serve_args("--model", str(tiny_folder), "--kv-memory", "4MiB", "--kv-cache-dtype", kv))
        blocks[kv] = engine.engine.blocks.num_blocks
        config = engine.engine.model.config
    stored = KV_CACHE_DTYPES[kv_cache_dtype]
    assert engine.engine.cache.k.dtype == stored
    assert blocks[kv_cache_dtype] == 4 * 2**20 // (16 * pool_bytes_per_token(config, stored))
    assert blocks[kv_cache_dtype] / blocks["auto"] > (3.5 if stored.itemsize == 1 else 1.9)
    assert f"{str(stored).removeprefix('torch.')}, " in capsys.readouterr().err


def test_a_kv_cache_dtype_the_backend_cannot_read_is_refused_at_start(tiny_folder):
    with pytest.raises(ValueError, match=r"triton backend reads K/V pools of the model's dtype \(torch.float32\) or "
                                         "int8, not torch.float8_e4m3fn: every --kv-cache-dtype runs on the torch and cpu"):
        build_server(serve_args("--model", str(tiny_folder), "--kv-blocks", "16", "--attention-backend", "triton",
                                "--kv-cache-dtype", "fp8"))


def test_without_graphs_start_up_captures_nothing(tiny_folder, capsys):
    engine, _ = build_server(serve_args("--model", str(tiny_folder), "--kv-blocks", "16"))
    assert engine.engine.runner.graphs is None and engine.engine.warm_up() == 0
    assert "capturing graphs" not in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--gpu-memory-utilization", "0.5"), ("--graph-max-seq-len", "64"),
                                        ("--graph-max-num-tokens", "0"), ("--dtype", "bfloat16")])
def test_local_engine_flags_are_refused_with_disaggregated(flag, value, capsys):
    assert main(["serve", "--disaggregated", flag, value]) == 2
    assert f"{flag} is not supported with --disaggregated" in capsys.readouterr().err
