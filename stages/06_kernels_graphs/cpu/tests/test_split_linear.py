"""SplitLinear (a linear as one bmm over row blocks of its weight) against nn.Linear."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course.s01_decode_loop.testing import tiny_model
from course.s06_kernels_graphs import cpu
from course.s06_kernels_graphs.engine import KernelEngineConfig, LLMEngine
from course.s06_kernels_graphs.fused_model import FusedCausalLM
from course.s06_kernels_graphs.cpu.split_linear import SplitLinear, split_linears

cpu.register()  # the room's backend and engine options, as the CLI plugs them in


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("lead", [(1,), (7,), (2, 5)])  # a decode row, a chunk, a batch of sequences
@pytest.mark.parametrize("bias", [False, True])
def test_equals_linear(parts, lead, bias):
    g = torch.Generator().manual_seed(parts)
    linear = nn.Linear(24, 36, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(36, 24, generator=g))
        if bias:
            linear.bias.copy_(torch.randn(36, generator=g))
    x = torch.randn(*lead, 24, generator=g)
    split = SplitLinear(linear, parts)
    assert split.weight is linear.weight  # shared, not copied
    torch.testing.assert_close(split(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)


def test_rows_that_do_not_split_are_refused_or_left_alone():
    with pytest.raises(ValueError, match="do not split"):
        SplitLinear(nn.Linear(4, 10), 3)
    module = nn.Sequential(nn.Linear(4, 10), nn.Linear(10, 9))
    split_linears(module, 2)
    assert isinstance(module[0], SplitLinear) and isinstance(module[1], nn.Linear)


def test_the_fused_copy_is_split_and_the_model_passed_in_is_not():
    model = tiny_model("gqa_tied")
    fused = split_linears(FusedCausalLM(model), 2)
    assert any(isinstance(m, SplitLinear) for m in fused.modules())
    assert not any(isinstance(m, SplitLinear) for m in model.modules())  # EAGLE still borrows its lm_head
    hidden = torch.randn(2, model.config.hidden_size)
    torch.testing.assert_close(fused.compute_logits(hidden), model.compute_logits(hidden), atol=1e-5, rtol=1e-5)


def test_splits_without_the_fused_copy_are_refused():
    with pytest.raises(ValueError, match="fused=True"):
        LLMEngine(tiny_model("gqa_tied"), None, KernelEngineConfig(num_blocks=8, linear_splits=2))


def test_bench_linear_times_every_way_on_one_row(capsys):
    from course.s06_kernels_graphs.cpu.bench_linear import run

    rows = run([1], parts=2)
    from course.s06_kernels_graphs.cpu.onednn import onednn_available

    assert [r["way"] for r in rows] == ["linear", "merged", "merged+split2", *["merged, oneDNN"] * onednn_available(),
                                        "bf16 merged", "bf16 merged+split2", "int8 w-only"]
    assert all(r["ms"] > 0 and r["rows"] == 1 for r in rows) and rows[0]["speedup"] == 1.0
