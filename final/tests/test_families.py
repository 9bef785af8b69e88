"""Families beyond the Llama shape served by `python -m course.final serve`: a folder transformers
wrote, greedy tokens through the openai client equal transformers' own full forward, past the
sliding windows; /v1/models names the architecture; the start-up says what it changed and why."""
import importlib

import openai
import pytest

from course.final.testing import start_cli_server as start
from course.final.testing import stop_cli_server as stop
from course.s01_decode_loop.families import FAMILIES
from course.s01_decode_loop.testing import greedy_reference_uncached, save_transformers_model

SAID = {"gemma3_text": "5 layers sliding over 8 tokens", "gpt_oss": "2 layers sliding over 8 tokens",
        "qwen3_next": "for 8 running sequences"}
EXTRA = {"qwen3_next": ["--max-num-seqs", "8"]}  # 128 sequences' states would not fit the 1 MiB


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_families_serve_a_folder_through_the_openai_client(tmp_path, byte_tok, model_type):
    module = importlib.import_module(f"course.s01_decode_loop.families.{FAMILIES[model_type][0]}")
    hf = save_transformers_model(module.tiny_config(), byte_tok, tmp_path)
    prompt = list(range(40, 70))  # past every tiny config's window
    want = greedy_reference_uncached(hf, prompt, 12)
    proc, url = start("--model", str(tmp_path), "--kv-memory", "1MiB", "--block-size", "4",
                      "--served-model-name", "tiny", *EXTRA.get(model_type, []))
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
                                        extra_body={"ignore_eos": True})
        card = client.models.list().data[0]
    finally:
        assert stop(proc) == 0
    assert out.choices[0].logprobs.tokens == [byte_tok.decode([t]) for t in want]
    assert card.model_extra["architecture"] == FAMILIES[model_type][2]
    assert SAID[model_type] in proc.stdout.read()


def test_families_a_hybrid_models_states_are_paid_from_the_kv_memory():
    """--kv-memory holds the running sequences' recurrent states, the snapshots (a quarter of it,
    at most 512), and the K/V pool, which gets the rest; states that cannot fit are refused by name."""
    from course.final.launch.kv_pool import MAX_STATE_SNAPSHOTS, SNAPSHOT_SHARE, hybrid_memory

    mib = 2**20
    pool, snapshots, line = hybrid_memory(64 * mib, per_sequence=mib, max_num_seqs=8)
    assert snapshots == int(64 * SNAPSHOT_SHARE) and pool == (64 - 8 - snapshots) * mib
    assert "8 running sequences" in line and f"{snapshots} snapshots" in line
    pool, snapshots, _ = hybrid_memory(2**40, per_sequence=mib, max_num_seqs=8)
    assert snapshots == MAX_STATE_SNAPSHOTS and pool == 2**40 - (8 + MAX_STATE_SNAPSHOTS) * mib
    with pytest.raises(ValueError, match="recurrent states of 128 sequences.*--max-num-seqs"):
        hybrid_memory(64 * mib, per_sequence=mib, max_num_seqs=128)


def test_families_the_server_keeps_the_snapshots_its_memory_holds(tmp_path, byte_tok):
    from course.final.cli import build_server, make_parser
    from course.s01_decode_loop.families.qwen3_next import tiny_config
    from course.s04_continuous_batching.hybrid.states import state_bytes

    save_transformers_model(tiny_config(), byte_tok, tmp_path)
    args = make_parser()[0].parse_args(["serve", "--model", str(tmp_path), "--kv-memory", "2MiB", "--max-num-seqs", "4"])
    engine = build_server(args)[0].engine
    per_sequence = state_bytes(engine.model.config)
    assert engine.states.max_snapshots == 2 * 2**20 // 4 // per_sequence
    per_block = sum(t.numel() * t.element_size() for t in engine.cache.tensors()) // engine.cache.k.shape[1]
    sized = engine.config.num_blocks * per_block  # the blocks --kv-memory bought (the engine adds its reserved one)
    states = (4 + engine.states.max_snapshots) * per_sequence
    assert sized + states <= 2 * 2**20 < sized + per_block + states


@pytest.mark.parametrize("kv_memory", ["2MiB", "24KiB"], ids=["groups_pay", "windows_need_it_all"])
def test_families_sliding_layers_get_their_windows_and_full_layers_the_rest(tmp_path, byte_tok, kv_memory):
    """Gemma 3 (5 sliding layers, 1 full): --kv-memory pays first for what the running sequences'
    windows hold in the sliding layers' group (window_group_blocks), then the full layer's blocks,
    which cost one layer each, so they are ~6x as many as one pool for every layer would hold.
    Where the windows would need more than that (a small pool), both groups get the same count."""
    from course.final.cli import build_server, make_parser
    from course.final.launch.kv_pool import parse_size
    from course.s01_decode_loop.families.gemma3 import tiny_config
    from course.s03_paged.layer_groups import window_group_blocks

    save_transformers_model(tiny_config(), byte_tok, tmp_path)
    args = make_parser()[0].parse_args(["serve", "--model", str(tmp_path), "--kv-memory", kv_memory,
                                        "--max-num-seqs", "4", "--max-num-batched-tokens", "32", "--block-size", "4"])
    engine = build_server(args)[0].engine
    full, sliding = engine.blocks.groups
    per_layer_block = engine.cache.parts[0].nbytes // (full.num_blocks + 1)  # the full group: one layer
    budget = parse_size(kv_memory)
    # what --kv-memory bought, within one block of every layer (the pools' dummy blocks)
    assert engine.cache.nbytes - 6 * per_layer_block <= budget < engine.cache.nbytes
    one_pool = budget // (6 * per_layer_block)  # blocks a single pool for all six layers would hold
    if kv_memory == "2MiB":
        assert sliding.num_blocks == window_group_blocks(8, 4, 4, 32) < full.num_blocks
        assert full.num_blocks > 4 * one_pool
    else:
        assert sliding.num_blocks == full.num_blocks == one_pool


def test_families_layer_groups_serve_chains_and_refuse_trees_by_name(byte_tok):
    """gpt-oss (sliding and full layers: two groups) with lookup drafts: the verified chains give
    the greedy ids of a run without speculation, every block comes back in both groups, and a
    speculative tree, whose accepted K/V would move within one pool, is refused by name."""
    from course.final.engine import Engine, SpeculativeConfig
    from course.final.speculation.trees import TreeDrafting
    from course.s01_decode_loop.families.testing import family_model
    from course.s01_decode_loop.generate import generate_naive
    from course.s01_decode_loop.sampling import SamplingParams
    from course.s06_kernels_graphs.engine import KernelEngineConfig

    model = family_model("gpt_oss")
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=2, max_num_batched_tokens=16)
    engine = Engine(model, byte_tok, config, speculative=SpeculativeConfig("lookup", 3))
    assert [g.window for g in engine.blocks.groups] == [None, 8]
    prompt = [5, 6, 7, 8] * 6  # repeats: lookup drafts find matches
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    out = engine.generate([prompt], params)[0]
    assert out.token_ids == generate_naive(model, byte_tok, prompt, params).token_ids
    assert sum(engine.accepted_per_position) > 0  # drafts were verified and kept
    assert [g.num_free_blocks for g in engine.blocks.groups] == [g.num_blocks for g in engine.blocks.groups]
    with pytest.raises(ValueError, match="layer groups"):
        TreeDrafting(engine)


def test_families_a_hybrid_model_speculates_with_its_state_rolled_back(byte_tok):
    """Qwen3-Next with drafts wrong at varied positions (so each verification accepts a different
    prefix): the recurrent state resumes after the accepted rows, and the greedy ids equal a run
    without speculation; a tree is refused by name."""
    from course.final.engine import Engine, SpeculativeConfig
    from course.s01_decode_loop.families.testing import family_model
    from course.s01_decode_loop.generate import generate_naive
    from course.s01_decode_loop.sampling import SamplingParams
    from course.s04_continuous_batching.hybrid.engine import HybridStates
    from course.s05_speculative.drafter import Draft, Drafter
    from course.s06_kernels_graphs.engine import KernelEngineConfig

    model = family_model("qwen3_next")
    greedy = SamplingParams(max_new_tokens=14, temperature=0.0, ignore_eos=True)
    prompts = [list(range(30, 52)), [5, 6, 7], list(range(60, 75))]
    truth = {tuple(p): generate_naive(model.eval(), byte_tok, p, greedy).token_ids for p in prompts}

    class WrongSometimes(Drafter):
        name = "oracle"

        def propose(self, seq, k):
            done = len(seq.output_ids)
            future = truth[tuple(seq.prompt_ids)][done:][:k]
            return Draft([t if (done + i) % 3 else (t + 1) % 256 for i, t in enumerate(future)])

    class HybridEngine(HybridStates, Engine):
        pass

    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    engine = HybridEngine(model, byte_tok, config, [257], SpeculativeConfig("lookup", 4), drafter=WrongSometimes())
    outs = engine.generate(prompts, greedy)
    assert [o.token_ids for o in outs] == [truth[tuple(p)] for p in prompts]
    stats = engine.spec_stats
    assert 0 < stats.accepted < stats.proposed  # some drafts rejected, some accepted
    with pytest.raises(ValueError, match="trees"):
        engine.trees = object()  # what --speculative-tree attaches


def test_families_the_launch_turns_off_what_a_family_cannot_take_and_refuses_it_when_asked():
    """Left to the defaults, fused layers and split linears are turned off (and said); asked for
    on the command line, they are refused, naming the flag. A hybrid model runs without graphs."""
    from types import SimpleNamespace

    from course.final.launch.model_fit import fit_options
    from course.s01_decode_loop.families.gemma3 import Gemma3Config, Gemma3ForCausalLM
    from course.s01_decode_loop.families.gemma3 import tiny_config as gemma_tiny
    from course.s01_decode_loop.families.qwen3_next import Qwen3NextConfig, Qwen3NextForCausalLM
    from course.s01_decode_loop.families.qwen3_next import tiny_config as next_tiny

    gemma = Gemma3ForCausalLM(Gemma3Config.from_hf(gemma_tiny()))
    defaults = dict(fused=True, linear_splits=2, quantization=None, cuda_graphs=True, overlap=True,
                    attention_backend="cpu")
    unset = SimpleNamespace(fused=None, linear_splits=None, quantization=None, cuda_graphs=None, overlap=None,
                            attention_backend=None)
    fitted, notes = fit_options(defaults, unset, gemma)
    assert (fitted["fused"], fitted["linear_splits"], fitted["cuda_graphs"]) == (False, 1, True)
    assert any(n.startswith("--fused off") for n in notes)
    with pytest.raises(ValueError, match="--fused"):
        fit_options(defaults, SimpleNamespace(**{**vars(unset), "fused": True}), gemma)
    hybrid = Qwen3NextForCausalLM(Qwen3NextConfig.from_hf(next_tiny()))
    fitted, _ = fit_options(defaults, unset, hybrid)
    assert (fitted["cuda_graphs"], fitted["overlap"]) == (False, False)
    with pytest.raises(ValueError, match="--overlap"):
        fit_options(defaults, SimpleNamespace(**{**vars(unset), "overlap": True}), hybrid)
