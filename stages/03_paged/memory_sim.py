"""How many requests fit in one KV budget, contiguous versus paged (a simulation: no model runs).

Stage 02 gives each request one contiguous slab for prompt_len + max_new_tokens slots, because
when a request arrives nobody knows how long its answer will be: most of the slab stays empty
(over-reservation). Paging hands out fixed-size blocks as the sequence grows, so a request
holds only ceil(tokens / block_size) blocks at its peak: at most one partly empty block each
(internal fragmentation).

Both layouts admit requests first come, first served, and stop at the first one that does not
fit, the way an FCFS scheduler would. Each request is counted at its peak size, prompt plus
answer, with the answer capped at max_new_tokens (generation stops there).

The numbers on real ShareGPT lengths: `python -m course.s03_paged.bench.benchmark`.
"""
from __future__ import annotations

from itertools import count

from course.s03_paged.block_manager import BlockManager, NoFreeBlocksError


def simulate(lengths: list[tuple[int, int]], budget_tokens: int, block_size: int = 16,
             max_new_tokens: int = 1024) -> dict:
    """`lengths` holds (prompt_len, output_len) per request, in arrival order. Returns, for each
    layout, how many requests are admitted, the KV slots they reserve and the slots that hold a
    token (utilization = used / reserved), plus the ratio admitted(paged) / admitted(contiguous)."""
    peaks = [p + min(o, max_new_tokens) for p, o in lengths]
    contiguous = _contiguous(lengths, peaks, budget_tokens, max_new_tokens)
    paged = _paged(lengths, peaks, budget_tokens, block_size)
    return {"contiguous": contiguous, "paged": paged,
            "ratio": _divide(paged["admitted"], contiguous["admitted"])}


def _contiguous(lengths, peaks, budget_tokens, max_new_tokens) -> dict:
    reserved = used = admitted = 0
    for (prompt_len, _), peak in zip(lengths, peaks):
        slab = prompt_len + max_new_tokens  # the answer's length is unknown: reserve the cap
        if reserved + slab > budget_tokens:
            break
        reserved, used, admitted = reserved + slab, used + peak, admitted + 1
    return _report(admitted, reserved, used)


def _paged(lengths, peaks, budget_tokens, block_size) -> dict:
    bm = BlockManager(budget_tokens // block_size, block_size, enable_prefix_caching=False)
    token_id = count()  # every token distinct: this measures the layout alone, not prefix sharing
    used = admitted = 0
    for seq_id, ((prompt_len, _), peak) in enumerate(zip(lengths, peaks)):
        try:
            bm.allocate(seq_id, [next(token_id) for _ in range(prompt_len)])
            bm.append_slot(seq_id, peak)  # grow to the peak: one more block per full block
        except NoFreeBlocksError:
            if seq_id in bm.tables:  # the prompt fitted but not the answer: give its blocks back
                bm.free(seq_id)
            break
        used, admitted = used + peak, admitted + 1
    reserved = (bm.num_blocks - bm.num_free_blocks) * block_size
    return {**_report(admitted, reserved, used), "blocks": bm.num_blocks - bm.num_free_blocks}


def _report(admitted: int, reserved: int, used: int) -> dict:
    return {"admitted": admitted, "reserved_slots": reserved, "used_slots": used,
            "utilization": _divide(used, reserved)}


def _divide(a: int, b: int) -> float:
    """a / b, where nothing over nothing is nan and something over nothing is infinite."""
    return a / b if b else (float("inf") if a else float("nan"))
