"""The gated delta rule: the linear attention of Qwen3-Next's Gated DeltaNet layers.

Softmax attention keeps every past key and value, so its memory grows with the sequence.
Linear attention keeps a fixed-size state instead: per head one matrix S [d_k, d_v], a
*fast-weight memory* that maps keys to values. Reading it is one product: the output for a
query q is S^T q. The gated delta rule says how each token writes into it:

    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T        a_t = exp(g_t), g_t <= 0
    o_t = S_t^T q_t

* decay: a_t in (0, 1] fades the whole memory a little at every token (a learned forget gate);
* delta: a_t S_{t-1}^T k_t is what the memory already returns for k_t, so only the error
  v_t - (that) is written: one step of gradient descent on ||S^T k_t - v_t||^2 with step size
  beta_t in (0, 1). Writing the same pair twice does not double it; beta_t = 1 overwrites.
  (Equivalently S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.)

Every function here takes ONE sequence and its state explicitly, in and out: stage 01 starts
each sequence from a zero state; later stages keep the state of each sequence in a cache and
carry it from one call to the next.

* recurrent_gated_delta_rule: the formula above, token by token: the reference, and what a
  decode step (one token) runs;
* chunk_gated_delta_rule: the same numbers a chunk of tokens at a time, as matrix products
  (what a prefill runs);
* causal_conv1d: the short per-channel convolution that runs in front of the rule; its state
  is the last kernel - 1 inputs.
"""
from __future__ import annotations

import torch

# Shapes, for one sequence of T tokens and H heads:
#   q, k [T, H, d_k]   v [T, H, d_v]   g, beta [T, H]   state [H, d_k, d_v]   out [T, H, d_v]
# Everything is computed in float32; `out` comes back in v's dtype, the state in float32.


def _start_state(k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None) -> torch.Tensor:
    if initial_state is None:  # a new sequence: an empty memory
        return torch.zeros(k.shape[1], k.shape[2], v.shape[2], dtype=torch.float32, device=k.device)
    return initial_state.float()


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule one token at a time: (out [T, H, d_v], final state [H, d_k, d_v])."""
    dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    state = _start_state(k, v, initial_state)
    out = torch.empty_like(v)
    for t in range(k.shape[0]):
        state = state * g[t].exp()[:, None, None]                       # forget a little
        recalled = torch.einsum("hk,hkv->hv", k[t], state)              # what the memory says for k_t
        error = beta[t][:, None] * (v[t] - recalled)                    # the correction, scaled by beta_t
        state = state + torch.einsum("hk,hv->hkv", k[t], error)         # write it under k_t
        out[t] = torch.einsum("hk,hkv->hv", q[t], state)                # read with q_t
    return out.to(dtype), state


def chunk_gated_delta_rule(q, k, v, g, beta, chunk_size: int = 64,
                           initial_state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as recurrent_gated_delta_rule, chunk_size tokens per step: a sequential loop
    over T / chunk_size chunks, each a few matrix products (see `_chunk`)."""
    dtype, state = v.dtype, _start_state(k, v, initial_state)
    q, k, v, g, beta = (x.float().transpose(0, 1) for x in (q, k, v, g, beta))  # heads first: [H, T, ...]
    out = torch.empty_like(v)
    for start in range(0, k.shape[1], chunk_size):
        c = slice(start, start + chunk_size)  # the last chunk may be shorter: no padding needed
        out[:, c], state = _chunk(q[:, c], k[:, c], v[:, c], g[:, c], beta[:, c], state)
    return out.transpose(0, 1).to(dtype), state


def _chunk(q, k, v, g, beta, state):
    """n tokens of every head ([H, n, ...]) from `state`: the recurrence unrolled.

    With G_i = g_1 + ... + g_i (the log-decay from the chunk's start through token i), token i
    writes u_i = beta_i (v_i - a_i S_{i-1}^T k_i); unrolling S_{i-1} over the chunk,

        u_i + sum_{j<i} beta_i e^{G_i - G_j} (k_i . k_j) u_j  =  beta_i v_i - beta_i e^{G_i} S^T k_i

    a unit lower-triangular system (I + A) U = ... for all n writes: one triangular solve
    replaces n dependent steps. Then reads and the new state are plain products:

        o_i   = e^{G_i} S^T q_i + sum_{j<=i} e^{G_i - G_j} (q_i . k_j) u_j
        S_new = e^{G_n} S       + sum_j     e^{G_n - G_j} k_j u_j^T
    """
    n = k.shape[1]
    G = g.cumsum(dim=-1)                                                   # [H, n]
    causal = torch.ones(n, n, dtype=torch.bool, device=k.device).tril()   # j <= i
    # e^{G_i - G_j} for j <= i, 0 above the diagonal (masked before exp: G_i - G_j > 0 there could overflow)
    decay = (G[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf")).exp()  # [H, n, n]
    k_beta = k * beta[..., None]
    A = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1)                 # A_ij = beta_i e^{G_i-G_j} k_i.k_j, j < i
    system = A + torch.eye(n, device=k.device)
    solve = lambda rhs: torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # noqa: E731
    # u = (I + A)^-1 (beta v) - (I + A)^-1 (beta e^G k) S: the first part needs no state, the second reads it
    writes = solve(v * beta[..., None]) - solve(k_beta * G.exp()[..., None]) @ state   # U [H, n, d_v]
    scores = (q @ k.transpose(-1, -2)) * decay                            # e^{G_i-G_j} q_i.k_j, j <= i
    out = (q * G.exp()[..., None]) @ state + scores @ writes
    to_end = (G[:, -1:] - G).exp()[..., None]                             # e^{G_n - G_j} [H, n, 1]
    new_state = state * G[:, -1].exp()[:, None, None] + (k * to_end).transpose(-1, -2) @ writes
    return out, new_state


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor,
                  initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A depthwise causal convolution: x [T, C], weight [C, K] -> (y [T, C], state [K-1, C]).

    Each channel c has its own kernel of K taps over its current input and the K-1 before it:
        y_t[c] = sum_j weight[c, j] * x_{t-K+1+j}[c]
    Before a sequence's first token those earlier inputs are zeros; in a later call they are
    `initial_state`, the last K-1 inputs of the call before (the returned state)."""
    t, c = x.shape
    kernel = weight.shape[-1]
    past = x.new_zeros(kernel - 1, c) if initial_state is None else initial_state.to(x.dtype)
    xs = torch.cat([past, x])                                             # [K-1+T, C]
    y = sum(weight[:, j] * xs[j: j + t] for j in range(kernel))
    return y, xs[t:]                                                      # the last K-1 inputs
