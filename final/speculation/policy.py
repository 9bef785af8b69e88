"""How many tokens to draft for each request, this step: only as many as pay for themselves.

A draft token costs time twice: drafting it (an EAGLE head step, a few ms on a CPU) and
verifying it (one more row in the target's forward); a request's proposal also costs a fixed
part (the drafter catching up on what was verified since). It pays only when it is accepted, and
the i-th draft of a request is accepted only if drafts 1..i-1 were. So the i-th draft of
request r is worth g(r, i) = a(r, 1) x ... x a(r, i) expected tokens, where a(r, j) is how
often r's j-th draft is kept once the ones before it were, and it costs c = (verify row) +
(draft step) seconds. A step that does N rows of work in T seconds (a token for each decoding
request; a prefill row, which the server owes anyway, counts as one) gets more done per second
from one more draft exactly when g / c > N / T. Drafts only fill the room the step's token
budget leaves: one that pushed a prompt's chunk out would trade a prompt's wait for a guess.
The policy adds the most valuable drafts first while that holds:
a lone request on a memory-bound step drafts deep; a wide batch, where a row is no longer
nearly free, or a request whose drafts keep missing, drafts little or nothing. vLLM and SGLang
switch speculation off above a fixed batch size; this uses what each request is actually
getting, and what this machine is actually paying (the AVX2 host pays more per draft step
than an AVX-512 one).

Everything is measured while serving, never read from a table:
* step time by rows (StepTimes): what all-decode steps of each size took, kept per size (sizes
  within 25% of each other share a point past 16 rows) and forgotten within a size as new steps
  of it come. A step's time is not one line in its rows: on a CPU a narrow step reads every
  weight for a row or two (memory-bound: a verified row costs ~1% of the step), a wide one
  multiplies them (compute-bound: each row costs its share). So what one more row costs is the
  slope of the points *near this step's size* (half to twice its rows); where those points do not
  spread enough to show a slope, a row is assumed to cost a quarter of the average row, which
  keeps a wide batch from drafting on a guess;
* drafting = per proposal + per position read + per draft token, fitted by least squares over
  every proposal (exponentially forgotten). "Read": before it drafts, an EAGLE head catches up
  on every position verified since its last draft (after a long idle stretch, hundreds). A
  request that drafts nothing yet pays the per-proposal part once, so its first m drafts are
  weighed together; its catch-up is charged over CATCH_UP_STEPS steps, since it is paid once
  and serves every later draft (charged whole, a request idle for long would never draft again);
* a(r, j): request r's own counts, blended with the engine-wide rate at position j (the prior,
  worth PRIOR_WEIGHT observations), so a new request starts from what others get. Counts age
  with every step (a request's by ACCEPT_FORGET, the engine's by PRIOR_FORGET towards an even
  chance): acceptance comes in stretches (a reply quoting its prompt, then not), so a request
  whose drafts missed drifts back to the prior while it drafts nothing and is tried again.

Every EXPLORE_EVERY steps, one request the policy gives no drafts drafts anyway, as many tokens
as add at most EXPLORE_BUDGET to those steps' time net of what they are expected to save, so
acceptance and the cost of wider steps stay measured (a drafter that starts guessing well, as a
reply turns to quoting its prompt, gets its drafts back). On a lone request a draft nearly pays
for itself, so a request whose drafts missed for a while is retried; in a wide batch a draft
costs a row's share of the products, so it seldom is. To start, one request at a time drafts
up to k until WARM_UP_PROPOSALS proposals are timed, then nothing is drafted until
WARM_UP_STEPS all-decode steps are: a lone request drafts as it would anyway, and a wide batch
pays for a few rows, never for a draft in every request.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from course.s05_speculative.eagle import DRAFT_ROOM

PRIOR_WEIGHT = 4.0      # the engine-wide acceptance rate counts as this many of a request's own tries
ACCEPT_FORGET = 0.95    # a request's own counts age by this per step (half-life ~14 steps)
PRIOR_FORGET = 0.995    # the engine-wide counts age by this per step (half-life ~140 steps)
EXPLORE_EVERY = 8       # every 8th step, one request drafting nothing drafts...
EXPLORE_BUDGET = 0.01   # ...as many tokens as add at most 1% to the time of those 8 steps
CATCH_UP_STEPS = 8      # a catch-up's cost is charged over this many steps of drafting
WARM_UP_PROPOSALS = 4   # proposals timed before the drafting costs are trusted
WARM_UP_STEPS = 8       # all-decode steps timed before the step costs are trusted
FORGET = 0.98           # each proposal's weight in the drafting fit decays by this per proposal
RIDGE = 1e-9            # keeps the drafting fit solvable when a column never varies
EXACT_ROWS = 16         # steps of up to 16 rows: a point per row count...
BUCKET_RATIO = 1.25     # ...past that, row counts within 25% of each other share a point
POINT_FORGET = 0.9      # a point's old steps decay by this per new step of its size (~10 steps' memory)
STALE_STEPS = 1000      # a point no step of its size refreshed for this many steps is dropped
PRIOR_SHARE = 0.25      # no slope measured near a size: a row costs this share of the average row


class LeastSquares:
    """y = c0 + c1 x1 + c2 x2 + ..., by least squares over exponentially forgotten points, every
    coefficient at least 0 (a column whose fit goes negative is left out and the rest refitted)."""

    def __init__(self, columns: int):
        n = columns + 1
        self.xtx = [[0.0] * n for _ in range(n)]
        self.xty = [0.0] * n
        self.seen = 0

    def add(self, xs: tuple[float, ...], y: float) -> None:
        row = (1.0, *xs)
        for i, a in enumerate(row):
            self.xty[i] = FORGET * self.xty[i] + a * y
            for j, b in enumerate(row):
                self.xtx[i][j] = FORGET * self.xtx[i][j] + a * b
        self.seen += 1

    def coefficients(self) -> list[float] | None:
        """[c0, c1, ...]; None before any point."""
        if not self.seen:
            return None
        keep = list(range(len(self.xty)))
        while True:
            a = torch.tensor([[self.xtx[i][j] for j in keep] for i in keep], dtype=torch.float64)
            a += RIDGE * (1.0 + a.diagonal().sum()) * torch.eye(len(keep), dtype=torch.float64)
            c = torch.linalg.solve(a, torch.tensor([self.xty[i] for i in keep], dtype=torch.float64)).tolist()
            if min(c) >= 0 or len(keep) == 1:
                out = [0.0] * len(self.xty)
                for i, v in zip(keep, c):
                    out[i] = max(v, 0.0)
                return out
            keep.pop(min(range(len(c)), key=c.__getitem__))


class StepTimes:
    """Seconds of an all-decode step by its rows: a point per size (see the module docstring)."""

    def __init__(self):
        self.points: dict[int, list[float]] = {}  # size bucket -> [weight, weighted rows, weighted seconds]
        self.refreshed: dict[int, int] = {}       # size bucket -> the step that last added to it
        self.seen = 0

    @staticmethod
    def bucket(rows: int) -> int:
        if rows <= EXACT_ROWS:
            return rows
        return EXACT_ROWS + round(math.log(rows / EXACT_ROWS) / math.log(BUCKET_RATIO))

    def add(self, rows: int, seconds: float) -> None:
        point = self.points.setdefault(self.bucket(rows), [0.0, 0.0, 0.0])
        point[0] = POINT_FORGET * point[0] + 1
        point[1] = POINT_FORGET * point[1] + rows
        point[2] = POINT_FORGET * point[2] + seconds
        self.seen += 1
        self.refreshed[self.bucket(rows)] = self.seen
        for bucket in [b for b, step in self.refreshed.items() if self.seen - step > STALE_STEPS]:
            del self.points[bucket], self.refreshed[bucket]  # the machine may have changed since

    def curve(self) -> list[tuple[float, float, float]]:
        """(rows, seconds, weight) of each point, by rows; seconds never fall as rows grow (a
        noisy point below a smaller size's time takes that time)."""
        out, highest = [], 0.0
        for w, r, t in sorted(self.points.values(), key=lambda p: p[1] / p[0]):
            highest = max(highest, t / w)
            out.append((r / w, highest, w))
        return out

    def per_row(self, rows: int, widest: int = 0) -> float | None:
        """Seconds one more row adds to a step of `rows` rows (that drafts may widen to `widest`):
        the weighted least-squares slope of the points from half that size to twice it (or to
        `widest`), if their sizes spread by a quarter of it (or by one row); otherwise
        PRIOR_SHARE of the nearest point's average row. None: no point yet."""
        curve = self.curve()
        if not curve:
            return None
        near = [(r, t, w) for r, t, w in curve if rows / 2 <= r <= max(2 * rows + 1, widest)]
        if len(near) >= 2 and near[-1][0] - near[0][0] >= max(1.0, rows / 4):
            n = sum(w for _, _, w in near)
            mr = sum(w * r for r, _, w in near) / n
            mt = sum(w * t for _, t, w in near) / n
            spread = sum(w * (r - mr) ** 2 for r, _, w in near)
            return max(sum(w * (r - mr) * (t - mt) for r, t, w in near) / spread, 0.0)
        r, t, _ = min(curve, key=lambda p: abs(math.log(p[0] / max(rows, 1))))
        return PRIOR_SHARE * t / r

    def at(self, rows: int) -> float | None:
        """Seconds of a step of `rows` rows (see `seconds`)."""
        seconds = self.seconds(rows)
        return seconds(rows) if seconds is not None else None

    def seconds(self, rows: int, widest: int = 0):
        """Step seconds as a function of its rows, for steps of `rows` that drafts may widen to
        `widest`: between two points on the line joining them (so where the kernel's blocking
        makes 3 rows cost what 1 does and 4 more, drafts see it), past the ends from the nearest
        end by `per_row`. None: no point yet."""
        curve = self.curve()
        if not curve:
            return None
        slope = self.per_row(rows, widest)

        def at(r: float) -> float:
            for (r0, t0, _), (r1, t1, _) in zip(curve, curve[1:]):
                if r0 <= r <= r1:
                    return t0 + (t1 - t0) * (r - r0) / (r1 - r0) if r1 > r0 else t1
            r_end, t_end, _ = curve[0] if r < curve[0][0] else curve[-1]
            return max(t_end + slope * (r - r_end), 0.0)
        return at


@dataclass
class Costs:
    """What the policy weighs, in seconds."""
    step: float      # a step of this batch's rows, without drafts
    per_row: float   # one more row in it (near this size: the slope of the points there)
    step_at: object  # seconds of a step of r rows (StepTimes.seconds): what m more rows cost exactly
    per_call: float  # a proposal, whatever it drafts
    per_read: float  # a position the drafter catches up on before drafting
    per_draft: float  # a draft token


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

    def age(self, factor: float) -> None:
        self.tried = [t * factor for t in self.tried]
        self.kept = [k * factor for k in self.kept]

    def rate(self, j: int, prior: float, weight: float) -> float:
        tried = self.tried[j] if j < len(self.tried) else 0.0
        kept = self.kept[j] if j < len(self.kept) else 0.0
        return (kept + weight * prior) / (tried + weight)


def _within(limits: dict[int, int], room: int) -> dict[int, int]:
    """Each request's limit cut so that all of them together fit `room` (earlier requests first)."""
    out = {}
    for rid, k in limits.items():
        out[rid] = min(k, room)
        room -= out[rid]
    return out


class CostModelPolicy:
    """Chooses each request's draft length per step (see the module's docstring)."""

    def __init__(self):
        self.step_times = StepTimes()         # seconds of an all-decode step by its rows
        self.draft_time = LeastSquares(2)     # seconds of a proposal: 1, tokens drafted, positions read
        self.everyone = Acceptance()          # the engine-wide prior
        self.per_request: dict[int, Acceptance] = {}
        self.steps_since_draft: dict[int, int] = {}
        self.until_explore = EXPLORE_EVERY
        self.last_rows = 1  # the last all-decode step's rows (what `describe` reports the costs at)

    # -- what the engine reports ---------------------------------------------------------------
    def observe_step(self, rows: int, seconds: float, all_decode: bool) -> None:
        if all_decode and rows > 0:
            self.step_times.add(rows, seconds)
            self.last_rows = rows

    def observe_drafting(self, tokens: int, seconds: float, read: int = 0) -> None:
        """One proposal: `tokens` draft steps after catching up on `read` positions."""
        if tokens > 0:
            self.draft_time.add((tokens, read), seconds)

    def record(self, request_id: int, drafted: int, accepted: int) -> None:
        self.per_request.setdefault(request_id, Acceptance()).record(drafted, accepted)
        self.everyone.record(drafted, accepted)

    def prune(self, alive: set[int]) -> None:
        for rid in set(self.per_request) - alive:
            del self.per_request[rid]
        for rid in set(self.steps_since_draft) - alive:
            del self.steps_since_draft[rid]

    # -- the choice ----------------------------------------------------------------------------
    def verify_cost(self, other_rows: int):
        """A step's seconds as a function of one request's rows (a tree's verify width), the
        step's other rows fixed; None until the costs are measured."""
        costs = self.costs(other_rows + 1, other_rows + 1 + DRAFT_ROOM)
        if costs is None:
            return None
        return lambda width: costs.step_at(other_rows + width)

    def costs(self, rows: int, widest: int = 0) -> Costs | None:
        """The costs at a step of `rows` rows that drafts may widen to `widest`, once measured."""
        fit = self.draft_time.coefficients()
        if self.step_times.seen < WARM_UP_STEPS or self.draft_time.seen < WARM_UP_PROPOSALS:
            return None
        per_call, per_draft, per_read = fit
        step_at = self.step_times.seconds(rows, widest)
        return Costs(step_at(rows), self.step_times.per_row(rows, widest), step_at, per_call, per_read, per_draft)

    def lengths(self, limits: dict[int, int], other_rows: int = 0, reads: dict[int, int] | None = None,
                room: int | None = None) -> dict[int, int]:
        """Draft length per request id, each at most its limit. `limits`: the requests that may
        draft this step (decoding, caught up), with the most each may draft; `other_rows`: rows
        the step runs besides one per such request (other decodes, prefill chunks: each counts
        as a row of work done, so a step busy with prefill has a high rate for drafts to beat);
        `reads`: positions each request's drafter would catch up on first; `room`: rows the
        step's token budget has left (a draft past it would push a prompt's chunk out)."""
        rows, reads = len(limits) + other_rows, reads or {}
        if room is not None:
            limits = _within(limits, room)
        self.everyone.age(PRIOR_FORGET)
        for rid in limits:
            if rid in self.per_request:
                self.per_request[rid].age(ACCEPT_FORGET)
        costs = self.costs(rows, rows + sum(limits.values()))
        if costs is None:  # warming up: one request drafts (the same one) until proposals are timed
            first = min((rid for rid, k in limits.items() if k > 0), default=None)
            if self.draft_time.seen >= WARM_UP_PROPOSALS:
                first = None  # then none, until the steps are
            return {rid: (k if rid == first else 0) for rid, k in limits.items()}
        call = {rid: costs.per_call + costs.per_read * reads.get(rid, 0) / CATCH_UP_STEPS for rid in limits}
        tokens, seconds, width = float(rows), costs.step, rows  # width: the step's rows with the drafts so far
        chosen = {rid: 0 for rid in limits}
        reach = {rid: 1.0 for rid in limits}  # probability that every draft so far was kept
        most = max(limits.values(), default=0)
        while True:
            # what m more rows add to this step, read off the measured curve at its width
            extra = [costs.step_at(width + m) - costs.step_at(width) for m in range(most + 1)]
            best = None  # (gain per second, request, drafts added, gain, seconds, reach after)
            for rid, k in chosen.items():
                # a request not drafting yet pays for the call once: weigh its first m drafts together
                gain, r = 0.0, reach[rid]
                for m in range(1, (limits[rid] - k if k == 0 else min(1, limits[rid] - k)) + 1):
                    r *= self._rate(rid, k + m - 1)
                    gain += r
                    cost = max((call[rid] if k == 0 else 0.0) + m * costs.per_draft + extra[m], 1e-9)
                    if best is None or gain / cost > best[0]:
                        best = (gain / cost, rid, m, gain, cost, r)
            if best is None or best[3] * seconds <= tokens * best[4]:  # more drafts would slow the step
                break
            _, rid, m, gain, cost, reach[rid] = best
            chosen[rid] += m
            tokens, seconds, width = tokens + gain, seconds + cost, width + m
        self._explore(chosen, limits, call, costs.per_row + costs.per_draft, seconds, tokens)
        return chosen

    def _explore(self, chosen: dict[int, int], limits: dict[int, int], call: dict[int, float], per_token: float,
                 seconds: float, tokens: float) -> None:
        """Every EXPLORE_EVERY steps, one request left without drafts (the one idle longest that
        the budget buys a token for) drafts as many tokens as cost at most EXPLORE_BUDGET of those
        steps' time beyond what they are expected to save: its acceptance, and what a wider step
        costs, stay measured."""
        for rid in chosen:
            self.steps_since_draft[rid] = 0 if chosen[rid] else self.steps_since_draft.get(rid, 0) + 1
        self.until_explore -= 1
        if self.until_explore > 0 or not chosen:
            return
        budget, per_token_saved = EXPLORE_BUDGET * EXPLORE_EVERY * seconds, seconds / tokens
        for rid in sorted((r for r in chosen if chosen[r] == 0 and limits[r] > 0),
                          key=lambda r: -self.steps_since_draft[r]):
            best, cost, gain, reach = 0, call[rid], 0.0, 1.0
            for m in range(1, limits[rid] + 1):
                reach *= self._rate(rid, m - 1)
                cost, gain = cost + per_token, gain + reach
                if cost - gain * per_token_saved <= budget:
                    best = m
            if best:
                chosen[rid], self.steps_since_draft[rid] = best, 0
                self.until_explore = EXPLORE_EVERY
                return

    def _rate(self, rid: int, position: int) -> float:
        prior = self.everyone.rate(position, 0.5, 1.0)
        own = self.per_request.get(rid)
        return own.rate(position, prior, PRIOR_WEIGHT) if own else prior

    def describe(self) -> dict:
        costs = self.costs(self.last_rows)
        return {"measured": costs is not None, "at_rows": self.last_rows,
                **({f"{name}_ms": seconds * 1e3 for name, seconds in vars(costs).items()
                    if isinstance(seconds, float)} if costs else {}),
                "step_ms_by_rows": {round(r): round(t * 1e3, 2) for r, t, _ in self.step_times.curve()},
                "acceptance_by_position": [round(self.everyone.rate(j, 0.0, 0.0), 3) if self.everyone.tried[j] else None
                                           for j in range(len(self.everyone.tried))]}
