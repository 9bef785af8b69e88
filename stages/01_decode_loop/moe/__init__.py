"""Mixture-of-Experts, the reference: a router picks k of E expert MLPs for each token, and the
layer's output is their outputs weighted by the router's probabilities.

    token x ──► router: softmax(x·Wg) over E experts ──► top-k (ids, weights)
            └─► expert[id] (a SwiGLU MLP) for each chosen id ──► Σ weight · expert(x)

* router.py: the top-k choice, renormalised where the config says (Mixtral always, Qwen-MoE
  per `norm_topk_prob`), ties broken as torch.topk breaks them (transformers' choice too);
* experts.py: the experts' weights stacked [E, 2I, H] / [E, H, I] (the layout transformers
  holds in memory, and what grouped kernels want) and the layer that loops over each token's
  chosen experts: obviously right, the reference every faster path is checked against;
* config.py: the config fields (Mixtral's, Qwen-MoE's) read from and written to HF configs;
* checkpoint.py: published checkpoints store one tensor per expert (`experts.N.gate_proj`,
  Mixtral's `block_sparse_moe.experts.N.w1`); they are stacked into that layout at load time.

A decode step runs one token through k experts, so it reads k of the E experts' weights: an
MoE model with 128 experts and top-8 reads about a sixteenth of its expert bytes per token.
"""
