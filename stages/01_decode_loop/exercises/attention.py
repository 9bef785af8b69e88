"""Exercise: attention, written out. Fill in the body below, then run

    pytest stages/01_decode_loop --exercise

`--exercise` (root conftest.py) puts this function in place of the reference one in
`course.s01_decode_loop.attention`, in that module's namespace (`torch` is there). Every test of
the stage that runs the model runs your attention. Without the flag the tests run the reference.
Read `attention.py`'s docstring first; its code is the answer, so try before you look.
"""
from __future__ import annotations

import torch


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
                     window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of one sequence.

    q: [Tq, H, d], the queries at positions q_start .. q_start+Tq-1;
    k, v: [Tk, Hkv, d], the keys and values at positions 0 .. Tk-1.
    * Grouped-query attention: each of the Hkv K/V heads serves H/Hkv consecutive query heads
      (`repeat_interleave` along the head dimension).
    * scores = q·k / sqrt(d), computed in float32;
    * causality: query i may see key j only if j <= q_start + i (mask the rest with -inf);
      with a `window`, also only if j > q_start + i - window (its last `window` positions);
    * softmax over the keys (with `sinks` [H]: `softmax_with_sinks`, one more logit per head in
      the denominator), weighted sum of v; return [Tq, H, d] in q's dtype."""
    raise NotImplementedError("exercise: stages/01_decode_loop/exercises/attention.py causal_attention")


class FullCausalAttention:
    def forward(self, layer, q, k, v, meta, sinks=None):
        """Stage 01's backend: a flat batch of whole sequences, back to back ([T, H, d] and
        [T, Hkv, d]); `meta.cu_seqlens_q` marks where each starts. Each sequence attends over
        exactly its own rows (`causal_attention` with q_start=0, the layer's
        `window=self.window(layer)` and `sinks`). Refuse, with ValueError, a batch
        whose query lengths differ from its sequence lengths (`meta.query_lens`, `meta.seq_lens`):
        this backend has no cache, so it cannot attend to tokens it was not given."""
        raise NotImplementedError("exercise: stages/01_decode_loop/exercises/attention.py FullCausalAttention.forward")
