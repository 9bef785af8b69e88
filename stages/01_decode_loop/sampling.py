"""Turning next-token logits into a token id.

Every decoding knob a request can set lives in `SamplingParams` (vLLM's name). The
logits go through a fixed chain of small, pure transforms (`process_logits`), then a
per-request `Sampler` either takes the argmax (greedy) or draws one sample.

Order of the chain, and why:
  1. repetition penalty          } penalties act on the raw scores, so they mean the
  2. presence/frequency penalty  } same thing whatever the temperature is
  3. temperature                 reshapes the distribution the filters below look at
  4. top-k, 5. top-p, 6. min-p   truncation filters: set unwanted tokens to -inf
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

IdsLike = Sequence[int] | torch.Tensor
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 or -1: disabled
    top_p: float = 1.0  # 1: disabled
    min_p: float = 0.0  # 0: disabled
    repetition_penalty: float = 1.0  # 1: disabled
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: fresh randomness for this request
    stop: list[str] = field(default_factory=list)  # stop strings
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob and the k most likely
    # Callables (output_ids, logits [vocab]) -> logits, applied before the chain below (vLLM's
    # hook): a grammar's token mask (stage 08) plugs in here, whatever loop produced the logits.
    logits_processors: list = field(default_factory=list)

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        def is_int(x) -> bool:  # bool is an int subclass; True is not a sensible top_k
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        check(is_int(self.max_new_tokens) and self.max_new_tokens >= 1, "max_new_tokens", "an integer >= 1")
        check(is_num(self.temperature) and self.temperature >= 0, "temperature", ">= 0 (0 = greedy)")
        check(is_int(self.top_k) and self.top_k >= -1, "top_k", "an integer >= -1 (0 or -1 = disabled)")
        check(is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]")
        check(is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]")
        check(is_num(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty", "> 0")
        for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's documented range
            check(is_num(getattr(self, name)) and -2 <= getattr(self, name) <= 2, name, "in [-2, 2]")
        # A torch.Generator takes seeds from -2**63 to 2**64 - 1; outside that it fails at the first
        # sample, so refuse here, when the request is made, not later inside a shared batch step.
        check(self.seed is None or (is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX), "seed",
              f"an integer in [{SEED_MIN}, {SEED_MAX}] or None")
        if isinstance(self.stop, str):  # OpenAI's API accepts a single string too
            self.stop = [self.stop]
        check(isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) and s for s in self.stop),
              "stop", "a string or a list of non-empty strings")
        self.stop = list(self.stop)
        check(isinstance(self.stop_token_ids, (list, tuple))
              and all(is_int(t) and t >= 0 for t in self.stop_token_ids),
              "stop_token_ids", "a list of integers >= 0")
        self.stop_token_ids = list(self.stop_token_ids)
        check(self.logprobs is None or (is_int(self.logprobs) and self.logprobs >= 0), "logprobs",
              "None or an integer >= 0")
        check(isinstance(self.logits_processors, (list, tuple)) and all(map(callable, self.logits_processors)),
              "logits_processors", "a list of callables (output_ids, logits) -> logits")
        self.logits_processors = list(self.logits_processors)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# --- Logit transforms -------------------------------------------------------------
# Each takes logits of shape [vocab] and returns a NEW tensor: the caller's logits are
# left alone, so the same model output can be inspected or re-sampled. The filters
# (temperature, top-k, top-p, min-p) also accept [batch, vocab]; the penalties take one
# sequence's ids, so they act on one row [vocab] (or apply the same ids to every row).

def _ids(ids: IdsLike, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(ids, dtype=torch.long, device=device).reshape(-1)


def apply_repetition_penalty(logits: torch.Tensor, seen_ids: IdsLike, penalty: float) -> torch.Tensor:
    """CTRL / Hugging Face style: make every token already seen (prompt + output) less likely.

    Dividing a positive logit and multiplying a negative one both push it down; a plain
    division would *raise* a negative logit. Each seen id is penalised once, however often:
    the values are read once, so a repeated id just writes the same result again.
    """
    ids = _ids(seen_ids, logits.device)
    out = logits.clone()
    if ids.numel() == 0:
        return out
    picked = out[..., ids]
    out[..., ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out


def apply_presence_frequency_penalty(logits: torch.Tensor, output_ids: IdsLike,
                                     presence: float, frequency: float) -> torch.Tensor:
    """OpenAI style, on generated tokens only: logit -= presence * (count > 0) + frequency * count."""
    ids = _ids(output_ids, logits.device)
    counts = torch.bincount(ids, minlength=logits.shape[-1]).to(logits.dtype)
    return logits - presence * (counts > 0).to(logits.dtype) - frequency * counts


def apply_temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    """t < 1 sharpens the distribution, t > 1 flattens it. t must be > 0 (0 is greedy, handled apart)."""
    if not t > 0:
        raise ValueError(f"temperature must be > 0 here, got {t!r}")
    return logits / t


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits, set the rest to -inf.

    Ties at the k-th value are all kept (so slightly more than k may survive): which of
    several equal tokens to drop would otherwise be an arbitrary choice.
    """
    if k <= 0 or k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus sampling: keep the smallest set of most probable tokens whose total
    probability is >= p; the most probable token is always kept.

    A token is kept when the probability mass strictly before it (in descending order)
    is still < p; the top token has 0 before it and p > 0, so it always stays. Equal
    probabilities are ordered lower id first (stable sort).
    """
    probs = torch.softmax(logits.float(), dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to vocab order
    return logits.masked_fill(~keep, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's probability.

    Unlike top-p, the cut scales with the model's confidence: a confident step keeps few
    tokens, an uncertain one keeps many.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def has_penalties(params: SamplingParams) -> bool:
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


def apply_penalties(logits: torch.Tensor, params: SamplingParams,
                    prompt_ids: IdsLike, output_ids: IdsLike) -> torch.Tensor:
    """Steps 1-2 of the chain, the enabled penalties, on one row [vocab] (they read that
    sequence's own ids, so a batched sampler still runs them row by row)."""
    out = logits
    if params.repetition_penalty != 1.0:
        seen = torch.cat([_ids(prompt_ids, out.device), _ids(output_ids, out.device)])
        out = apply_repetition_penalty(out, seen, params.repetition_penalty)
    if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        out = apply_presence_frequency_penalty(out, output_ids, params.presence_penalty,
                                               params.frequency_penalty)
    return out


def process_logits(logits: torch.Tensor, params: SamplingParams,
                   prompt_ids: IdsLike, output_ids: IdsLike) -> torch.Tensor:
    """Apply the enabled transforms in the documented order (see the module docstring).

    Computes in float32 whatever the model's dtype, and always returns a new tensor. For
    greedy decoding only the penalties run: temperature and the filters never change
    which token has the largest logit, but penalties can.
    """
    out = apply_penalties(logits.to(torch.float32, copy=True), params, prompt_ids, output_ids)
    if params.greedy:
        return out
    if params.temperature != 1.0:
        out = apply_temperature(out, params.temperature)
    if params.top_k > 0:
        out = apply_top_k(out, params.top_k)
    if params.top_p < 1.0:
        out = apply_top_p(out, params.top_p)
    if params.min_p > 0.0:
        out = apply_min_p(out, params.min_p)
    return out


class Sampler:
    """Picks the next token for one request; owns that request's random generator.

    A generator per request (not torch's global one) means a seeded request gives the
    same tokens whatever other requests run beside it, in whatever order.
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        # Without a seed, draw a fresh one from the OS, without touching torch's global
        # RNG; keeping it lets a run be replayed.
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._generator: torch.Generator | None = None  # made on first use, on the logits' device

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
        elif self._generator.device != device:
            raise ValueError(f"this request's generator is on {self._generator.device}, logits on {device}")
        return self._generator

    def sample(self, logits: torch.Tensor, prompt_ids: IdsLike, output_ids: IdsLike) -> int:
        """logits: [vocab] for the next position. Returns the chosen token id."""
        if logits.dim() != 1:
            raise ValueError(f"expected 1-D logits [vocab], got shape {tuple(logits.shape)}")
        processed = process_logits(logits, self.params, prompt_ids, output_ids)
        if self.params.greedy:
            return int(torch.argmax(processed))  # ties -> lowest id
        probs = torch.softmax(processed, dim=-1)
        # Exponential race: with q_i ~ Exponential(1) independent, argmax_i(p_i / q_i) is an
        # exact sample from p (the token whose "arrival time" q_i / p_i comes first). Unlike an
        # inverse-CDF draw it uses exactly one number per vocab entry every step, whatever
        # the logits, and each q_i belongs to token i. So two engines that compute slightly
        # different logits (later stages: KV cache, batching, kernels) still consume the
        # generator identically and, unless two tokens are in a near-tie, pick the same token.
        # (torch.multinomial(probs, 1) happens to do this internally today; writing it out
        # makes it our contract rather than a library detail.)
        q = torch.empty_like(probs).exponential_(generator=self._generator_for(probs.device))
        q.clamp_(min=torch.finfo(q.dtype).tiny)  # q == 0 would make 0/0 = NaN for a -inf token
        return int(torch.argmax(probs / q))


def token_logprobs(logits: torch.Tensor, token_id: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability and the k most likely (id, logprob) pairs.

    Computed on the model's raw logits, before penalties, temperature and filters (what vLLM
    returns by default): a logprob then means the same thing whatever the sampling knobs.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, k) if k > 0 else None
    pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
    return float(logp[token_id]), pairs
