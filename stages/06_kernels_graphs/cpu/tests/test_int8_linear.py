"""Int8 weight-only linears: the quantization's error is bounded, both kernel paths compute the
same product, the engine keeps it off unless asked, and on the default model it agrees with
float32 (teacher-forced top-1) and keeps perplexity close."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.fused_model import FusedCausalLM
from course.s06_kernels_graphs.cpu.int8_linear import Int8Linear, quantize_linears, quantize_rows
from course.s06_kernels_graphs.cpu.precision import perplexity, top1_agreement

cpu.register()  # the room's backend and engine options, as the CLI plugs them in


def test_rows_quantize_within_half_a_step():
    w = torch.randn(40, 24, generator=torch.Generator().manual_seed(0))
    w[3] = 0  # an all-zero row must not divide by zero
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert torch.all((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7)
    assert torch.equal(q[3], torch.zeros(24, dtype=torch.int8))


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 40])  # up to 8: the int8 kernel; more: dequantized bf16
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("parts", [1, 2])
def test_both_paths_compute_the_dequantized_product(rows, bias, parts):
    g = torch.Generator().manual_seed(rows)
    linear = nn.Linear(64, 48, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=g) * 0.1)
    layer = Int8Linear(linear, max_int8_rows=8, parts=parts)
    x = torch.randn(rows, 64, generator=g)
    want = F.linear(x.bfloat16().float(), layer.dequantized(), linear.bias)  # what bf16 activations x int8 weights mean
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 48)
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
    assert (got - F.linear(x, linear.weight, linear.bias)).abs().max() < 0.1  # and close to float32's


def test_off_unless_chosen_and_refused_without_the_fused_copy(byte_tok):
    model = tiny_model("gqa_tied")
    plain = LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=32, block_size=4, fused=True))
    assert not any(isinstance(m, Int8Linear) for m in plain.runner.model.modules())
    with pytest.raises(ValueError, match="fused=True"):
        LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=8, quantization="int8"))
    with pytest.raises(ValueError, match="unknown quantization"):
        LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=8, quantization="int4", fused=True))


def test_the_int8_engine_generates_and_leaves_the_model_passed_in_untouched(byte_tok):
    model = tiny_model("gqa_tied")
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    engine = LLMEngine(model, byte_tok, KernelEngineConfig(num_blocks=32, block_size=4, max_num_batched_tokens=12,
                                                           fused=True, linear_splits=2, quantization="int8"),
                       [TINY_EOS])
    assert sum(isinstance(m, Int8Linear) for m in engine.runner.model.modules()) == 4 * model.config.num_hidden_layers + 1
    out = engine.generate([list(b"hello"), list(b"a prompt longer than the budget of twelve")],
                          SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [6, 6]
    assert engine.blocks.num_free_blocks == 32  # the pool is whole
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())


def test_default_model_int8_agrees_with_float32(smollm2):
    """Teacher-forced on float32's own greedy answer: int8 picks the same top-1 token at >= 90%
    of positions, and perplexity of a held-out text stays within 5%."""
    from course.s01_decode_loop.generate import encode_prompt, generate_naive

    tok, model = smollm2.tokenizer, smollm2.model
    reference = FusedCausalLM(model)
    int8 = quantize_linears(FusedCausalLM(model), parts=2)
    prompt = encode_prompt(tok, "Explain why the sky is blue in two sentences.", chat=True)
    answer = generate_naive(model, tok, prompt, SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)).token_ids
    assert top1_agreement(reference, int8, prompt, answer) >= 0.9
    text = tok.encode("The river rose through the night, and by morning the village had moved its boats "
                      "to the hill behind the church, where they waited for the water to fall.", add_special_tokens=False)
    assert perplexity(int8, [text]) == pytest.approx(perplexity(reference, [text]), rel=0.05)
