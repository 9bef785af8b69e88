"""Our from-scratch model computes what transformers' LlamaForCausalLM computes."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.generate import encode_prompt, generate_naive
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import hf_twin

PROMPT_LENGTHS = [1, 7, 100]  # a single token, a short prompt, one past llama3_rope's original context


@torch.no_grad()
def our_logits_flat(model, seqs):
    """All sequences in ONE flat forward pass; returns per-sequence logits."""
    ids = torch.tensor([t for s in seqs for t in s])
    meta = AttentionMetadata.for_full_sequences([len(s) for s in seqs])
    logits = model.compute_logits(model(ids, FullCausalAttention(), meta))
    return logits.split([len(s) for s in seqs])


def test_model_logits_match_transformers(tiny):
    name, model = tiny
    hf = hf_twin(model)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    for ours, seq in zip(our_logits_flat(model, seqs), seqs):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0]
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def test_model_ragged_batch_equals_each_alone(tiny):
    _, model = tiny
    seqs = [[5, 6, 7], list(range(20, 60)), [9]]
    batched = our_logits_flat(model, seqs)
    for seq, together in zip(seqs, batched):
        (alone,) = our_logits_flat(model, [seq])
        torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)


def test_model_greedy_matches_transformers_generate(tiny, byte_tok):
    name, model = tiny
    hf = hf_twin(model)
    for prompt in ["Hello", "The quick brown fox jumps over", "数"]:
        ids = byte_tok(prompt).input_ids
        ours = generate_naive(model, byte_tok, ids, SamplingParams(max_new_tokens=32, temperature=0,
                                                                   ignore_eos=True))
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                          pad_token_id=0)[0, len(ids):].tolist()
        assert ours.token_ids == ref, name


def test_config_rejects_non_llama_models():
    with pytest.raises(ValueError, match="gpt2"):
        ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10, "hidden_size": 8,
                             "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_hf({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
                             "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                             "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="linear_attention"):
        ModelConfig.from_hf({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
                             "num_hidden_layers": 1, "num_attention_heads": 2, "layer_types": ["linear_attention"]})


def test_config_reads_transformers5_rope_parameters():
    cfg = ModelConfig.from_hf({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
                               "num_hidden_layers": 1, "num_attention_heads": 2,
                               "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None and cfg.num_key_value_heads == 2


@pytest.mark.slow
def test_real_model_logits_match_transformers(smollm2):
    hf = AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()
    tok = smollm2.tokenizer
    prompts = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a land far away, "
               "there lived a dragon who loved to read books about"]
    seqs = [tok(p).input_ids for p in prompts]
    for ours, seq in zip(our_logits_flat(smollm2.model, seqs), seqs):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0]
        # float32 on CPU; observed max difference ~5e-5 on logits of magnitude ~30
        torch.testing.assert_close(ours, ref, atol=2e-3, rtol=1e-4)


@pytest.mark.slow
def test_real_model_greedy_matches_transformers_generate(smollm2):
    hf = AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()
    tok = smollm2.tokenizer
    ids = encode_prompt(tok, "Write a haiku about the sea.", chat=True)  # the logits test above covers the rest
    ours = generate_naive(smollm2.model, tok, ids, SamplingParams(max_new_tokens=32, temperature=0),
                          smollm2.eos_token_ids)
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    assert ours.token_ids == ref
