"""How many KV blocks the server allocates: the flags' figure, or, on CUDA, what the card has left
(the CPU's figure comes from its memory: sizing.py).

    budget = utilization x total memory - memory in use (weights, other processes) - reserve
    blocks = budget // bytes per block - the engine's reserved blocks (the graphs' dummy block)

as vLLM's `--gpu-memory-utilization` does. The reserve is the memory a step needs beyond the
pool: its activations, float32 logits for every token of the largest step, and the graphs'
shared pool. `memory_info` returns (free, total) bytes, `torch.cuda.mem_get_info` on a card;
tests pass a fake card."""
from __future__ import annotations

from typing import Callable

import torch

from course.s02_kv_cache.kv_size import human
from course.s03_paged.layer_groups import window_group_blocks
from course.s03_paged.quantized_kv import pool_bytes_per_token

from .sizing import GPU_BUDGET, GPU_SEQS

DEFAULT_BLOCKS = 512   # 8,192 tokens at 16 a block: where nothing sizes the pool (the CPU server sizes
                       # it from memory, sizing.py, before it gets here)
GRAPH_RESERVE = 512 * 2**20  # captured graphs' pool and the allocator's slack


def step_reserve(config, max_num_tokens: int, dtype: torch.dtype) -> int:
    """Bytes a step of `max_num_tokens` tokens needs besides the pool: float32 logits, the
    widest activations (gate-up output; residual, norm and o_proj output; the QKV output, wider
    than the hidden size where head_dim x heads exceeds it, as in Qwen3) twice over, the graphs' pool."""
    width = torch.empty((), dtype=dtype).element_size()
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    activations = max_num_tokens * (2 * config.intermediate_size + 3 * config.hidden_size + qkv) * width
    return max_num_tokens * config.vocab_size * 4 + 2 * activations + GRAPH_RESERVE


def blocks_for_memory(bytes_per_block: int, utilization: float, reserve: int, reserved_blocks: int = 1,
                      memory_info: Callable[[], tuple[int, int]] | None = None) -> int:
    """The most blocks that fit in `utilization` of the card after what is in use and `reserve`."""
    if not 0 < utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], not {utilization}")
    free, total = (memory_info or torch.cuda.mem_get_info)()
    in_use = total - free
    budget = int(utilization * total) - in_use - reserve
    blocks = budget // bytes_per_block - reserved_blocks
    if blocks < 1:
        raise ValueError(
            f"--gpu-memory-utilization {utilization} of {human(total)} leaves {human(max(budget, 0))} for the KV "
            f"cache ({human(in_use)} in use, {human(reserve)} kept for a step's activations and graphs): not one "
            f"block of {human(bytes_per_block)}. Raise --gpu-memory-utilization, free the card, or give --kv-blocks")
    return blocks


UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str, flag: str = "--kv-memory") -> int:
    """'512MiB', '2GB', '1e9' -> bytes."""
    number = text.rstrip("KMGiBkmgib")
    unit = text[len(number):].upper()
    try:
        return int(float(number) * UNITS[unit])
    except (KeyError, ValueError):
        raise ValueError(f"{flag}: cannot read {text!r} as a size (examples: 512MiB, 2GiB, 1e9)") from None


def num_kv_blocks(args, kv_memory: int | None, model_config, dtype: torch.dtype, device: str = "cpu",
                  memory_info=None, reserved_blocks: int = 1, kv_dtype: torch.dtype | None = None,
                  layers: int | None = None, beside: int = 0) -> int:
    """--kv-blocks as given; or as many blocks as `kv_memory` bytes (--kv-memory) hold for this
    model, its K/V stored as `kv_dtype` (default: `dtype`; int8 codes and their scales count); or,
    on CUDA, as many as --gpu-memory-utilization of the card leaves after the weights
    (`memory_info` as torch.cuda.mem_get_info); else 512. With layer groups: `layers`, the full
    group's (its blocks cost only those), and `beside`, the bytes the sliding groups take first."""
    per_block = args.block_size * pool_bytes_per_token(model_config, kv_dtype or dtype)
    if layers is not None:  # one layer group's pool (the full-attention layers')
        per_block = per_block // model_config.num_kv_layers * layers
    if kv_memory is not None:
        if kv_memory <= beside:
            raise ValueError(f"--kv-memory {args.kv_memory} cannot hold the sliding layers' windows of "
                             f"{args.max_num_seqs} sequences ({human(beside)}) and the full layers' blocks: raise "
                             "--kv-memory or lower --max-num-seqs")
        blocks = (kv_memory - beside) // per_block
        if blocks < 1:
            raise ValueError(f"--kv-memory {args.kv_memory} holds no block: one block of {args.block_size} tokens "
                             f"takes {per_block} bytes for this model")
        return blocks
    if args.kv_blocks is not None:
        return args.kv_blocks
    if not device.startswith("cuda"):
        return DEFAULT_BLOCKS
    tokens = max(args.max_num_batched_tokens or GPU_BUDGET, args.max_num_seqs or GPU_SEQS)
    reserve = step_reserve(model_config, tokens, dtype) + beside
    return blocks_for_memory(per_block, args.gpu_memory_utilization, reserve, reserved_blocks, memory_info)


def describe_windows(model_config, block_size: int, groups: list | None = None) -> str | None:
    """What sliding-window layers do to the pool, for the start-up line; None without them.
    `groups`: (window, layers, blocks) per layer group, where the engine keeps them."""
    windows = model_config.layer_windows
    if not windows:
        return None
    sliding = [w for w in windows if w is not None]
    if len(sliding) == len(windows) and len(set(sliding)) == 1:
        held = sliding[0] // block_size + 2
        return (f"sliding window of {sliding[0]} tokens in every layer: a sequence holds at most {held} blocks "
                f"({held * block_size} tokens) however long it grows; blocks behind the window are released")
    if not groups:
        return (f"sliding window of {max(sliding)} tokens in {len(sliding)} of {len(windows)} layers: masked in "
                "attention; one block table for every layer (CUDA graphs), so a sequence keeps every block")
    return "layer groups: " + "; ".join(
        f"{len(layers)} {'full-attention layers keep every block' if w is None else f'layers sliding over {w} tokens'}"
        f" ({blocks} blocks{'' if w is None else ', released behind the window'})" for w, layers, blocks in groups)


def sliding_group_bytes(model_config, groups: list, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                        kv_dtype: torch.dtype) -> int:
    """The bytes a model's sliding layer groups take (stage 03's layer_groups.py): each what its
    running sequences' windows hold (window_group_blocks, and the dummy block). The full-attention
    group gets the rest of the memory."""
    per_layer_token = pool_bytes_per_token(model_config, kv_dtype) // model_config.num_kv_layers
    return sum((window_group_blocks(w, block_size, max_num_seqs, max_num_batched_tokens) + 1)
               * block_size * per_layer_token * len(layers) for w, layers in groups[1:])


def grouped_kv_blocks(args, kv_memory: int | None, model_config, dtype: torch.dtype, groups: list, **sizing) -> int:
    """num_kv_blocks for a pool of layer groups (stage 03's layer_groups.py; [] for one table): the
    sliding groups take what their windows need first (sliding_group_bytes) and the full-attention
    layers' blocks the rest, each costing only those layers; where the windows would need more
    than one pool for every layer holds, that one count serves all groups."""
    blocks = num_kv_blocks(args, kv_memory, model_config, dtype, **sizing)
    need = max((window_group_blocks(w, args.block_size, args.max_num_seqs, args.max_num_batched_tokens)
                for w, _ in groups[1:]), default=0)
    if groups and blocks > need:
        beside = sliding_group_bytes(model_config, groups, args.block_size, args.max_num_seqs,
                                     args.max_num_batched_tokens, sizing.get("kv_dtype") or dtype)
        blocks = num_kv_blocks(args, kv_memory, model_config, dtype, **sizing, layers=len(groups[0][1]), beside=beside)
    return blocks


MAX_STATE_SNAPSHOTS = 512  # a hybrid model's state snapshots kept for prefix hits, at most...
SNAPSHOT_SHARE = 0.25      # ...and within this share of --kv-memory


def hybrid_memory(kv_memory: int, per_sequence: int, max_num_seqs: int) -> tuple[int, int, str]:
    """Split --kv-memory for a model with linear-attention layers, whose recurrent states live
    beside the pool: each running sequence's state (`per_sequence` bytes), the snapshots taken at
    block boundaries for prefix hits (as many as SNAPSHOT_SHARE of the memory holds, at most
    MAX_STATE_SNAPSHOTS), and the K/V pool, which gets the rest. Returns (the pool's bytes, the
    snapshots to keep, the start-up line)."""
    live = per_sequence * max_num_seqs
    snapshots = min(MAX_STATE_SNAPSHOTS, int(kv_memory * SNAPSHOT_SHARE) // per_sequence)
    pool = kv_memory - live - snapshots * per_sequence
    if pool <= 0:
        raise ValueError(f"--kv-memory {human(kv_memory)} cannot hold the recurrent states of {max_num_seqs} "
                         f"sequences ({human(per_sequence)} each, {human(live)} in all) and a K/V pool: raise "
                         "--kv-memory or lower --max-num-seqs")
    line = (f"state cache: {human(per_sequence)} of recurrent state a sequence; of {human(kv_memory)}, "
            f"{human(live)} for {max_num_seqs} running sequences, {human(snapshots * per_sequence)} for "
            f"{snapshots} snapshots (prefix hits resume from them), {human(pool)} for the K/V pool")
    return pool, snapshots, line
