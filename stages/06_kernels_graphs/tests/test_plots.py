"""The notebook's roofline figure: each measured step at its intensity and achieved rate, under the roof."""
import matplotlib

matplotlib.use("Agg")

from course.s01_decode_loop.testing import tiny_model  # noqa: E402
from course.s06_kernels_graphs.bench.plots import plot_roofline, roofline_points  # noqa: E402
from course.s06_kernels_graphs.bench.roofline import decode_cost  # noqa: E402


def test_the_roofline_places_each_batch_at_its_intensity_and_rate():
    model = tiny_model("gqa_tied")
    rows = [{"variant": "runner+fused", "batch": b, "step_ms": 2.0 * b} for b in (1, 4)] + \
           [{"variant": "runner", "batch": 1, "step_ms": 9.0}]
    points = roofline_points(model, rows, context=32)
    cost = decode_cost(model, 4, 32)
    assert [p[0] for p in points] == [1, 4]  # the chosen variant only
    assert points[1][1:] == (cost.intensity, cost.flops / 8e-3 / 1e9)
    fig = plot_roofline(model, rows, 32, bandwidth=10e9, flops=100e9)
    roof, *steps = fig.axes[0].get_lines()
    assert len(steps) == 2 and max(roof.get_ydata()) == 100.0  # the compute roof, in GFLOP/s
    assert [line.get_xdata()[0] for line in steps] == [p[1] for p in points]


def test_a_quantized_pool_counts_its_codes_and_scales():
    """An int8 pool moves a byte a value plus a scale byte per (token, KV head): the roofline
    counts what the kernel reads, not the model's dtype."""
    import torch

    from course.s03_paged.quantized_kv import pool_bytes_per_token

    model = tiny_model("gqa_tied")
    c = model.config
    full, int8 = decode_cost(model, 4, 32), decode_cost(model, 4, 32, kv_dtype=torch.int8)
    assert full.kv_bytes == 4 * 32 * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    assert int8.kv_bytes == 4 * 32 * pool_bytes_per_token(c, torch.int8)
    assert int8.kv_bytes == 4 * 32 * 2 * c.num_hidden_layers * c.num_key_value_heads * (c.head_dim + 1)
    assert int8.weight_bytes == full.weight_bytes and int8.intensity > full.intensity
