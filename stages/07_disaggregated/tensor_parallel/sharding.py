"""Cut a loaded model into one rank's shard, in place, on the model's plain torch forward path.

    attention  q/k/v column-parallel: rank r keeps query heads r*H/N .. and KV heads r*Hkv/N ..
               (a GQA group, H/Hkv query heads and their KV head, never straddles two ranks);
               o_proj row-parallel: all-reduce #1 of the layer
    MLP        gate/up column-parallel, down row-parallel: all-reduce #2
    MoE        every expert's gate/up rows and down columns cut the same way (router and shared
               gate kept whole); the block's summed output: all-reduce #2
    embedding  vocab-parallel (one all-reduce per step); lm_head vocab-parallel (one all-gather)

The model's own modules stay (model.py runs unchanged); only their linears are replaced and
`Attention.n_heads / n_kv_heads` set to this rank's. `model.config` becomes the shard's config
(heads, KV heads and MLP widths over N, the vocabulary whole), so the engine's KV pool, built
from it, holds only this rank's KV heads.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import MLP, CausalLM
from course.s01_decode_loop.moe.experts import SparseMoeBlock

from .comm import Collectives
from .layers import ReducedOutput, RowParallelLinear, VocabParallelEmbedding, VocabParallelHead, vocab_slice


def check_divisible(config: ModelConfig, world_size: int) -> None:
    """ValueError naming every width that N does not divide (vLLM refuses the same way)."""
    widths = {"attention heads": config.num_attention_heads, "KV heads": config.num_key_value_heads}
    if config.num_experts == 0 or config.mlp_only_layers or config.decoder_sparse_step > 1:
        widths["MLP intermediate size"] = config.intermediate_size
    if config.num_experts:
        widths["expert intermediate size"] = config.moe_intermediate_size
    if config.shared_expert_intermediate_size:
        widths["shared expert intermediate size"] = config.shared_expert_intermediate_size
    if world_size < 1:
        raise ValueError(f"tensor parallel size must be at least 1, not {world_size}")
    bad = [f"{name} ({n})" for name, n in widths.items() if n % world_size]
    if bad:
        ok = [n for n in range(1, config.num_attention_heads + 1) if all(w % n == 0 for w in widths.values())]
        raise ValueError(f"tensor parallel size {world_size} must divide the {', '.join(bad)}; "
                         f"this model splits over {ok} ranks")


def shard_config(config: ModelConfig, n: int) -> ModelConfig:
    """The config of one rank's shard: every split width over n, the vocabulary kept whole."""
    return dataclasses.replace(
        config, num_attention_heads=config.num_attention_heads // n,
        num_key_value_heads=config.num_key_value_heads // n, intermediate_size=config.intermediate_size // n,
        moe_intermediate_size=config.moe_intermediate_size // n,
        shared_expert_intermediate_size=config.shared_expert_intermediate_size // n)


def column(full: nn.Linear, rows: slice) -> nn.Linear:
    """A Linear keeping `rows` of the output (column-parallel: no communication)."""
    out = nn.Linear(full.in_features, rows.stop - rows.start, bias=full.bias is not None,
                    device=full.weight.device, dtype=full.weight.dtype)
    out.weight.data = full.weight.detach()[rows].clone()
    if full.bias is not None:
        out.bias.data = full.bias.detach()[rows].clone()
    return out.requires_grad_(False)


def part(n_total: int, comm: Collectives) -> slice:
    size = n_total // comm.world_size
    return slice(comm.rank * size, (comm.rank + 1) * size)


def shard_mlp(mlp, comm: Collectives) -> None:
    """Gate/up column-parallel, down row-parallel (a dense MLP, or Qwen2-MoE's shared expert)."""
    rows = part(mlp.gate_proj.out_features, comm)
    mlp.gate_proj, mlp.up_proj = column(mlp.gate_proj, rows), column(mlp.up_proj, rows)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, comm)


def shard_experts(block: SparseMoeBlock, comm: Collectives) -> None:
    """Each expert's intermediate width cut like a dense MLP's, all experts on every rank."""
    experts = block.experts
    inter = experts.down_proj.shape[2]
    rows = part(inter, comm)
    gate, up = experts.gate_up_proj.detach().split(inter, dim=1)
    experts.gate_up_proj = nn.Parameter(torch.cat([gate[:, rows], up[:, rows]], dim=1).clone(), requires_grad=False)
    experts.down_proj = nn.Parameter(experts.down_proj.detach()[:, :, rows].clone(), requires_grad=False)
    if block.shared_expert is not None:  # its down_proj must not reduce on its own: the block does, once
        shared = block.shared_expert
        rows = part(shared.gate_proj.out_features, comm)
        shared.gate_proj, shared.up_proj = column(shared.gate_proj, rows), column(shared.up_proj, rows)
        shared.down_proj = column_of_inputs(shared.down_proj, rows)


def column_of_inputs(full: nn.Linear, cols: slice) -> nn.Linear:
    """A Linear reading only input columns `cols` (a partial sum, reduced by the caller)."""
    out = nn.Linear(cols.stop - cols.start, full.out_features, bias=False, device=full.weight.device,
                    dtype=full.weight.dtype)
    out.weight.data = full.weight.detach()[:, cols].clone()
    return out.requires_grad_(False)


@torch.no_grad()
def shard_model(model: CausalLM, comm: Collectives) -> CausalLM:
    """Rank comm.rank's shard of `model`, cut in place (the full tensors are freed as it goes)."""
    config, n = model.config, comm.world_size
    check_divisible(config, n)
    for layer in model.model.layers:
        attn = layer.self_attn
        d = attn.head_dim
        q_rows = part(attn.n_heads, comm)
        kv_rows = part(attn.n_kv_heads, comm)
        attn.q_proj = column(attn.q_proj, slice(q_rows.start * d, q_rows.stop * d))
        attn.k_proj = column(attn.k_proj, slice(kv_rows.start * d, kv_rows.stop * d))
        attn.v_proj = column(attn.v_proj, slice(kv_rows.start * d, kv_rows.stop * d))
        attn.o_proj = RowParallelLinear(attn.o_proj, comm)
        attn.n_heads, attn.n_kv_heads = attn.n_heads // n, attn.n_kv_heads // n
        if isinstance(layer.mlp, MLP):
            shard_mlp(layer.mlp, comm)
        else:
            shard_experts(layer.mlp, comm)
            layer.mlp = ReducedOutput(layer.mlp, comm)
    embed = VocabParallelEmbedding(model.model.embed_tokens, comm)
    head_weight = embed.weight if config.tie_word_embeddings else nn.Parameter(
        vocab_slice(model.lm_head.weight, comm), requires_grad=False)
    model.model.embed_tokens = embed
    model.lm_head = VocabParallelHead(head_weight, config.vocab_size, comm)
    model.config = shard_config(config, n)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this process holds (a tied weight once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())
