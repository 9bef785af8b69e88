"""How many tokens to draft for each request, this step: only as many as pay for themselves.

A draft token costs time twice: drafting it (an EAGLE head step, a few ms on a CPU) and
verifying it (one more row in the target's forward); a request's proposal also costs a fixed
part (the drafter catching up on what was verified since). It pays only when it is accepted, and
the i-th draft of a request is accepted only if drafts 1..i-1 were. So the i-th draft of
request r is worth g(r, i) = a(r, 1) x ... x a(r, i) expected tokens, where a(r, j) is how
often r's j-th draft is kept once the ones before it were, and it costs c = (verify row) +
(draft step) seconds. A step that emits N tokens in T seconds gets faster from one more draft
exactly when g / c > N / T. The policy adds the most valuable drafts first while that holds:
a lone request on a memory-bound step drafts deep; a wide batch, where a row is no longer
nearly free, or a request whose drafts keep missing, drafts little or nothing. vLLM and SGLang
switch speculation off above a fixed batch size; this uses what each request is actually
getting, and what this machine is actually paying (the AVX2 host pays more per draft step
than an AVX-512 one).

Everything is measured while serving, never read from a table:
* step time = fixed + per_row x rows, fitted by least squares over recent all-decode steps
  (exponentially forgotten, so a change of load or host shows within a few hundred steps);
* drafting = per proposal + per draft token, fitted the same way over every proposal (a
  request's first left out: the drafter reads the whole prompt then). A request that drafts
  nothing yet pays the per-proposal part once, so its first m drafts are weighed together;
* a(r, j): request r's own counts, blended with the engine-wide rate at position j (the prior,
  worth PRIOR_WEIGHT observations), so a new request starts from what others get.

Every EXPLORE_EVERY steps, one request the policy gives no drafts drafts one token anyway, when
that adds at most EXPLORE_BUDGET to those steps' time, so acceptance stays measured (a drafter that starts guessing well, as a
reply turns to quoting its prompt, gets its drafts back). Until the costs are measured (the
first WARM_UP_STEPS all-decode steps), every request drafts up to k.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_WEIGHT = 4.0      # the engine-wide acceptance rate counts as this many of a request's own tries
EXPLORE_EVERY = 8       # every 8th step, one request drafting nothing tries one token...
EXPLORE_BUDGET = 0.03   # ...if that adds at most 3% to the time of those 8 steps
WARM_UP_STEPS = 8       # all-decode steps measured before the costs are trusted
FORGET = 0.98           # each step's weight in the fits decays by this per step (~50 steps' memory)


@dataclass
class LinearFit:
    """y = intercept + slope x, by least squares over exponentially forgotten points."""
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    seen: int = 0

    def add(self, x: float, y: float) -> None:
        f = FORGET
        self.n, self.sx, self.sy = f * self.n + 1, f * self.sx + x, f * self.sy + y
        self.sxx, self.sxy = f * self.sxx + x * x, f * self.sxy + x * y
        self.seen += 1

    def slope_intercept(self) -> tuple[float, float] | None:
        spread = self.n * self.sxx - self.sx * self.sx
        if self.n < 2 or spread <= 1e-9 * max(1.0, self.n * self.sxx):
            return None  # every step had the same number of rows: no slope to see yet
        slope = (self.n * self.sxy - self.sx * self.sy) / spread
        return max(slope, 0.0), max((self.sy - slope * self.sx) / self.n, 0.0)


@dataclass
class Acceptance:
    """Kept / tried counts by draft position (position 1 = the first draft)."""
    tried: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        need = drafted - len(self.tried)
        if need > 0:
            self.tried += [0.0] * need
            self.kept += [0.0] * need
        for j in range(min(drafted, accepted + 1)):  # drafts past the first miss were never tried
            self.tried[j] += 1
            self.kept[j] += j < accepted

    def rate(self, j: int, prior: float, weight: float) -> float:
        tried = self.tried[j] if j < len(self.tried) else 0.0
        kept = self.kept[j] if j < len(self.kept) else 0.0
        return (kept + weight * prior) / (tried + weight)


class CostModelPolicy:
    """Chooses each request's draft length per step (see the module's docstring)."""

    def __init__(self):
        self.step_time = LinearFit()    # seconds of an all-decode step against its rows
        self.draft_time = LinearFit()   # seconds of a proposal against the tokens it drafts
        self.everyone = Acceptance()    # the engine-wide prior
        self.per_request: dict[int, Acceptance] = {}
        self.steps_since_draft: dict[int, int] = {}
        self.until_explore = EXPLORE_EVERY
        self.caught_up: set[int] = set()  # requests whose first proposal is behind them

    # -- what the engine reports ---------------------------------------------------------------
    def observe_step(self, rows: int, seconds: float, all_decode: bool) -> None:
        if all_decode and rows > 0:
            self.step_time.add(rows, seconds)

    def observe_drafting(self, request_id: int, tokens: int, seconds: float) -> None:
        """One request's proposal: a cost per call (catching up on the tokens verified since, the
        Python around it) and one per draft step. Its first proposal is left out: the drafter
        reads the whole prompt then (EAGLE runs its head over it)."""
        if request_id not in self.caught_up:
            self.caught_up.add(request_id)
            return
        if tokens > 0:
            self.draft_time.add(tokens, seconds)

    def record(self, request_id: int, drafted: int, accepted: int) -> None:
        self.per_request.setdefault(request_id, Acceptance()).record(drafted, accepted)
        self.everyone.record(drafted, accepted)

    def prune(self, alive: set[int]) -> None:
        for rid in set(self.per_request) - alive:
            del self.per_request[rid]
        for rid in set(self.steps_since_draft) - alive:
            del self.steps_since_draft[rid]
        self.caught_up &= alive

    # -- the choice ----------------------------------------------------------------------------
    def verify_cost(self, other_rows: int):
        """A step's seconds as a function of one request's rows (a tree's verify width), the
        step's other rows fixed; None until the costs are measured."""
        costs = self.costs()
        if costs is None:
            return None
        fixed, per_row = costs[0], costs[1]
        return lambda width: fixed + per_row * (other_rows + width)

    def costs(self) -> tuple[float, float, float, float] | None:
        """(fixed seconds of a step, seconds per row, per proposal, per draft token), once measured."""
        fit = self.step_time.slope_intercept()
        if fit is None or self.step_time.seen < WARM_UP_STEPS or self.draft_time.seen == 0:
            return None
        per_row, fixed = fit
        drafting = self.draft_time.slope_intercept()
        if drafting is None:  # every proposal drafted as many tokens: no split to see, all per token
            return fixed, per_row, 0.0, self.draft_time.sy / self.draft_time.sx
        per_draft, per_call = drafting
        return fixed, per_row, per_call, per_draft

    def lengths(self, limits: dict[int, int], other_rows: int = 0) -> dict[int, int]:
        """Draft length per request id, each at most its limit. `limits`: the requests that may
        draft this step (decoding, caught up), with the most each may draft; `other_rows`: rows
        the step runs besides one per such request."""
        costs = self.costs()
        if costs is None:
            return dict(limits)
        fixed, per_row, per_call, per_draft = costs
        tokens, seconds = float(len(limits)), fixed + per_row * (len(limits) + other_rows)
        chosen = {rid: 0 for rid in limits}
        reach = {rid: 1.0 for rid in limits}  # probability that every draft so far was kept
        while True:
            best = None  # (gain per second, request, drafts added, gain, seconds, reach after)
            for rid, k in chosen.items():
                # a request not drafting yet pays for the call once: weigh its first m drafts together
                gain, cost, r = 0.0, per_call if k == 0 else 0.0, reach[rid]
                for m in range(1, (limits[rid] - k if k == 0 else min(1, limits[rid] - k)) + 1):
                    r *= self._rate(rid, k + m - 1)
                    gain, cost = gain + r, cost + per_row + per_draft
                    if best is None or gain / cost > best[0]:
                        best = (gain / cost, rid, m, gain, cost, r)
            if best is None or best[3] * seconds <= tokens * best[4]:  # more drafts would slow the step
                break
            _, rid, m, gain, cost, reach[rid] = best
            chosen[rid] += m
            tokens, seconds = tokens + gain, seconds + cost
        self._explore(chosen, limits, per_call + per_row + per_draft, seconds)
        return chosen

    def _explore(self, chosen: dict[int, int], limits: dict[int, int], cost: float, seconds: float) -> None:
        """Every EXPLORE_EVERY steps, one request left without drafts (the one idle longest)
        drafts a token, if that adds at most EXPLORE_BUDGET to those steps' time: its acceptance
        stays measured, at a bounded price."""
        for rid in chosen:
            self.steps_since_draft[rid] = 0 if chosen[rid] else self.steps_since_draft.get(rid, 0) + 1
        self.until_explore -= 1
        idle = [rid for rid in chosen if chosen[rid] == 0 and limits[rid] > 0]
        if self.until_explore <= 0 and idle and cost <= EXPLORE_BUDGET * EXPLORE_EVERY * seconds:
            rid = max(idle, key=lambda r: self.steps_since_draft[r])
            chosen[rid], self.steps_since_draft[rid] = 1, 0
            self.until_explore = EXPLORE_EVERY

    def _rate(self, rid: int, position: int) -> float:
        prior = self.everyone.rate(position, 0.5, 1.0)
        own = self.per_request.get(rid)
        return own.rate(position, prior, PRIOR_WEIGHT) if own else prior

    def describe(self) -> dict:
        costs = self.costs()
        names = ("step_fixed_ms", "per_row_ms", "per_proposal_ms", "per_draft_ms")
        return {"measured": costs is not None, **({n: c * 1e3 for n, c in zip(names, costs)} if costs else {}),
                "acceptance_by_position": [round(self.everyone.rate(j, 0.0, 0.0), 3) if self.everyone.tried[j] else None
                                           for j in range(len(self.everyone.tried))]}
