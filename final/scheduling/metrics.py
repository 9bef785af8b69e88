"""What a schedule did to its requests: job completion time (JCT), TTFT, and head-of-line
blocking, summarised for the scheduling benchmark (plots.py draws and tabulates the runs)."""
from __future__ import annotations

import statistics

from course.s01_decode_loop.bench.measure import percentile

from .cost_model import CostModel
from .simulator import Completion


def alone_s(cost: CostModel, prompt_tokens: int, output_tokens: int) -> float:
    """The request's JCT with the engine to itself: its prefill, then one decode step per token."""
    return cost.step_time(prompt_tokens, 1, prompt_tokens) + sum(
        cost.step_time(1, 1, prompt_tokens + k) for k in range(1, output_tokens))


def summarize(completions: list[Completion], cost: CostModel, short_output_tokens: int) -> dict:
    """Mean / p50 / p99 JCT and TTFT, and the share of short requests (answers of at most
    `short_output_tokens`) *stuck behind long ones*: still waiting for their first token when,
    alone, they would have been done."""
    jct = [c.jct_s for c in completions]
    ttft = [c.ttft_s for c in completions]
    short = [c for c in completions if c.output_tokens <= short_output_tokens]
    stuck = [c for c in short if c.ttft_s > alone_s(cost, c.prompt_tokens, c.output_tokens)]
    longest = sorted(completions, key=lambda c: c.output_tokens)[-max(1, len(completions) // 10):]
    return {"requests": len(completions), "jct_mean_s": statistics.fmean(jct), "jct_p50_s": percentile(jct, 50),
            "jct_p99_s": percentile(jct, 99), "ttft_mean_s": statistics.fmean(ttft),
            "ttft_p99_s": percentile(ttft, 99), "short_stuck_frac": len(stuck) / max(1, len(short)),
            "short_jct_mean_s": statistics.fmean(c.jct_s for c in short) if short else None,
            "longest_10pct_jct_mean_s": statistics.fmean(c.jct_s for c in longest),
            "preemptions": sum(c.num_preemptions for c in completions)}


def quantiles(values: list[float], points: int = 201) -> list[float]:
    """The distribution in `points` evenly spaced percentiles (a CDF small enough to store)."""
    return [percentile(values, 100 * i / (points - 1)) for i in range(points)]

