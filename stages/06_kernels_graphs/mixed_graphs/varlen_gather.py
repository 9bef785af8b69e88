"""The torch backend's attention for a captured step that is not all decodes.

Stage 03 attends prefill chunks sequence by sequence, reading each one's lengths on the host: a
CUDA graph cannot capture that. Here every row of the step finds its sequence on the device (a
searchsorted over `cu_seqlens_q`), gathers that sequence's whole table and masks the keys past
its own position: more bytes than needed (T x L keys), but fixed shapes and no host sync. Rows
of no sequence (a token bucket's padding) see no key and come out as zeros.
"""
from __future__ import annotations

import torch


def varlen_attention_gather(q, k_pool, v_pool, cu_seqlens_q, positions, block_tables, seq_lens, window=None):
    """torch_backend.decode_attention_gather for a ragged step: q [T, H, D], rows
    cu_seqlens_q[b]:[b+1] of sequence b at `positions`; block_tables [B, W]; seq_lens [B].
    Returns [T, H, D] in q's dtype; each row sees its sequence's keys up to its own position
    (in a sliding layer, its last `window` positions)."""
    t, h, d = q.shape
    num_seqs, kv_heads = seq_lens.shape[0], k_pool.shape[2]
    rows = torch.arange(t, device=q.device)
    seq = torch.searchsorted(cu_seqlens_q[1:], rows, right=True)  # [T]: the sequence of each row
    owned = seq < num_seqs
    seq = seq.clamp(max=num_seqs - 1)
    keys = k_pool[block_tables[seq]].flatten(1, 2)  # [T, W*bs, Hkv, D]
    values = v_pool[block_tables[seq]].flatten(1, 2)
    qg = q.float().view(t, kv_heads, h // kv_heads, d)
    scores = torch.einsum("tngd,tlnd->tngl", qg, keys.float()) * d ** -0.5
    span = torch.arange(keys.shape[1], device=q.device)[None, :]
    visible = (span <= positions[:, None]) & (span < seq_lens[seq][:, None]) & owned[:, None]  # [T, L]
    if window is not None:
        visible &= span > positions[:, None] - window
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.where(visible[:, None, None, :], scores.softmax(-1), 0.)  # an all-masked row: 0, not NaN
    out = torch.einsum("tngl,tlnd->tngd", weights.nan_to_num(0.), values.float())
    return out.reshape(t, h, d).to(q.dtype)
