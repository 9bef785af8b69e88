"""What a GPU needs beyond the lesson's kernels.

The lesson's kernels (decode_attention.py, prefill_attention.py) are written to be read and
to run under the interpreter. A Hopper GPU wants more from them: both attention products on
tensor cores, tiles sized for a warpgroup, enough bytes in flight to reach HBM bandwidth, and
a launch grid that depends only on shapes so that every step can be replayed from a graph.
This room holds those kernels, the table of tile sizes per card, and a report of what the
compiler makes of every kernel of the stage for sm_90, which runs without a GPU.
"""


def register() -> None:
    """Plug the room into the lesson: the Triton backend's "gpu" kernel set, and the blocked
    MoE experts (fused_moe.py's layout in PyTorch) for every captured step."""
    from ..backend_base import register_captured_experts
    from ..triton_backend import register_kernel_set
    from .fused_moe import blocked_experts
    from .kernel_set import GpuKernels

    register_kernel_set(GpuKernels)
    register_captured_experts(blocked_experts)
