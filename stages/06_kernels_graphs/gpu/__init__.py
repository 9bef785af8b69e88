"""What a GPU needs beyond the lesson's kernels.

The lesson's kernels (decode_attention.py, prefill_attention.py) are written to be read and
to run under the interpreter. A Hopper GPU wants more from them: both attention products on
tensor cores, tiles sized for a warpgroup, enough bytes in flight to reach HBM bandwidth, and
a launch grid that depends only on shapes so that every step can be replayed from a graph.
This room holds those kernels, the table of tile sizes per card, and a report of what the
compiler makes of every kernel of the stage for sm_90, which runs without a GPU.
"""
