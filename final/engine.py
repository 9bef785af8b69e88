"""The final engine: stage 06's engine (stage 04's scheduler, stage 06's runner) with stage 05's
speculation inside the continuous batch.

Every step, before scheduling, each running request that is caught up (decoding) asks the
drafter for up to k guesses. The scheduler gives it k+1 rows (spec_scheduler.py), so its last
token and its drafts ride in the same ragged forward as other requests' prefill chunks and
plain decodes. Then, per request:

    target rows  = logits of [last, d_1 .. d_k], processed as if the drafts were emitted
    emitted      = stage 05's verify (greedy, or rejection sampling for sampled requests)
    num_computed += len(emitted)      (K/V of the last token and the accepted drafts stay)
    blocks.truncate(num_computed)     (lookahead blocks past them go back to the pool)

Requests accept different lengths in one step; an EOS or a stop string inside an accepted run
ends the request there. A request's grammar (a `response_format`) first cuts its draft at the
first token it forbids, then masks every verified row, and its matcher rolls back to what was
kept; its masks are filled on a worker thread while the forward runs (mask_prefetch.py).
Requests that ask for logprobs are not speculated (emitted drafts have none), nor those added
with `speculative=False` (they decode plainly beside drafted neighbours), nor, under a draft
policy, seeded sampled ones: rejection sampling draws one number per verified draft, so a
request's tokens follow how many drafts it was given, and a policy gives them by the load; a
seed should mean the same tokens alone as in a crowd. Both per-request
options, the switch and the grammar, ride on the request itself (`ServedRequest`).
Drafters: prompt lookup, or EAGLE with one feature store and head cache per request
(drafters.py), fed every chunk's hidden states and rolled back with the verification. With the
`trees` seam plugged in (speculation/trees.py), greedy requests draft EAGLE-2 trees instead:
their rows attend along their own paths, and the accepted path's K/V move next to the root.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from course.s04_continuous_batching.batch_sampler import samples_on_device
from course.s04_continuous_batching.engine import StepOutput
from course.s04_continuous_batching.request import Request
from course.s05_speculative.drafter import Draft, Drafter
from course.s05_speculative.speculative import SpecStats, emit, processed_rows
from course.s05_speculative.verify import accept_greedy, verify_greedy, verify_sampled
from course.s06_kernels_graphs.engine import LLMEngine

from .drafters import BorrowedTarget, DraftSource, EagleSource, make_source
from .mask_prefetch import MaskPrefetcher
from .spec_scheduler import SpeculativeScheduler

METHODS = ("none", "lookup", "eagle")


@dataclass
class SpeculativeConfig:
    method: str = "none"             # "none", "lookup" (prompt lookup, vLLM's "ngram") or "eagle"
    num_speculative_tokens: int = 4  # k: drafts per request per step
    eagle_head: str | None = None    # default: stage 05's head, trained for SmolLM2-135M
    disable_by_batch_size: int | None = None  # no drafts in a step with more running requests (vLLM's rule)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown speculative method {self.method!r}; choose one of {list(METHODS)}")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")


@dataclass(eq=False)
class ServedRequest(Request):
    """Stage 04's request, with the two options of an API request that this engine reads."""
    speculative: bool = True  # False: never drafted for
    grammar: Any = None       # its response_format's logits processor (stage 08), also among its sampling's


class Engine(LLMEngine):
    def __init__(self, model, tokenizer, config=None, eos_token_ids=(), speculative: SpeculativeConfig | None = None,
                 drafter: Drafter | DraftSource | None = None, prefetch_masks: bool = True, **kwargs):
        """`drafter` overrides the one `speculative.method` names (tests pass an oracle)."""
        super().__init__(model, tokenizer, config, eos_token_ids, scheduler_cls=SpeculativeScheduler, **kwargs)
        self.speculative = speculative = speculative or SpeculativeConfig()
        if speculative.method != "none" and speculative.num_speculative_tokens >= self.config.max_num_batched_tokens:
            raise ValueError(f"num_speculative_tokens {speculative.num_speculative_tokens} leaves no room in a step of "
                             f"{self.config.max_num_batched_tokens} tokens (a request verifies k drafts + 1 token); "
                             f"use fewer than {self.config.max_num_batched_tokens}")
        # EAGLE borrows the embedding of the model passed in and the lm_head the engine runs, and
        # its own linears become what the engine makes of a draft's (int8 on the CPU: stage 06)
        if isinstance(drafter, Drafter):
            drafter = DraftSource(drafter)
        target = BorrowedTarget(model, self.runner.model) if self.config.fused else model
        self.source = drafter or make_source(speculative.method, target, speculative.eagle_head)
        if isinstance(self.source, EagleSource):
            self.source.head = self.prepare_module(self.source.head, draft=True)
            self.source.use_engine_products(self.runner.model)
            self.source.tap(self.runner.model)  # before any graph is captured: the taps come out of it
        self.last_features = None  # the step's rows as the drafter reads them (source.features_of)
        self.drafts = self.scheduler.drafts
        self.draft_probs: dict[int, torch.Tensor | None] = {}  # sampled requests: q of each draft
        self.spec_stats = SpecStats()
        self.accepted_per_position = [0] * self.speculative.num_speculative_tokens
        self._acceptance_rngs: dict[int, torch.Generator] = {}  # per sampled request: reproducible draws
        self.mask_prefetcher = MaskPrefetcher() if prefetch_masks else None
        # called after each forward with its chunks and their final hidden rows (harness/ scores prompts)
        self.after_forward: list[Callable[[list, torch.Tensor], None]] = []
        # chooses each request's draft length per step from measured costs (speculation/);
        # None: k for every request, and none above disable_by_batch_size
        self.draft_policy = None
        # EAGLE-2 trees for greedy requests (speculation/trees.py, --speculative-tree); None: chains
        self.trees = None
        self._step_shape = (0, False)  # the last forward's rows, and whether every row was a decode

    def add_request(self, prompt_ids, params, priority: int = 0, *, speculative: bool = True, grammar=None) -> int:
        """Stage 04's add_request, with the request's options (keyword-only). A `grammar` joins the
        request's logits processors here, so its masks are applied as well as read."""
        if grammar is not None:
            params = dataclasses.replace(params, logits_processors=[*params.logits_processors, grammar])
        rid = super().add_request(prompt_ids, params, priority)  # its refusals, its queue bound
        req = self.requests[rid]
        req.speculative, req.grammar = speculative, grammar
        return rid

    def add_sequence(self, seq, priority: int = 0, *, speculative: bool = True, grammar=None) -> int:
        """Queue a Sequence from `make_sequence` (its sampling already holds `grammar`'s mask)."""
        rid = next(self._ids)
        self.requests[rid] = req = ServedRequest(rid, seq, priority=priority, speculative=speculative,
                                                 grammar=grammar)
        self.scheduler.add(req)
        return rid

    def step(self) -> list[StepOutput]:
        self._propose()
        self._step_shape, started = (0, False), time.perf_counter()
        outputs = super().step()
        if self.draft_policy is not None:  # the step's measured time: what a verified row costs
            rows, all_decode = self._step_shape
            self.draft_policy.observe_step(rows, time.perf_counter() - started, all_decode)
        alive = {r.request_id for r in self.scheduler.running + self.scheduler.waiting}
        if self.source is not None:  # finished, aborted or failed requests leave no drafter state
            self.source.prune(alive)
            if self.draft_policy is not None:
                self.draft_policy.prune(alive)
        return outputs

    def _propose(self) -> None:
        self.drafts.clear()
        if self.trees is not None:
            self.trees.drafted.clear()
        limit = self.speculative.disable_by_batch_size
        if self.source is None or (limit is not None and len(self.scheduler.running) > limit):
            return  # a wide batch is no longer memory-bound: verifying k more rows each costs more than it saves
        limits, requests = {}, {}
        for req in self.scheduler.running:
            seq = req.seq
            if req.num_uncomputed != 1 or seq.params.logprobs is not None or not req.speculative:
                continue  # prefilling, asking for logprobs (emitted drafts have none), or opted out
            if self.draft_policy is not None and seq.params.seed is not None and not seq.params.greedy:
                continue  # seeded sampling: its draws follow its drafts, which the policy sizes by the load
            room = min(seq.params.max_new_tokens - len(seq.output_ids), self.max_model_len - req.num_tokens)
            limits[req.request_id] = min(self.speculative.num_speculative_tokens, room - 1)  # verified rows must fit
            requests[req.request_id] = req
        reads = {}  # positions each drafter reads before it drafts (what the policy charges for them)
        if self.draft_policy is not None:
            reads = {rid: self.source.catch_up(req) for rid, req in requests.items()}
            others = self.other_rows(requests)
            limits = self.draft_policy.lengths(limits, others, reads,
                                               room=self.config.max_num_batched_tokens - len(limits) - others)
        for rid, k in limits.items():
            if k > 0:
                req, started = requests[rid], time.perf_counter()
                tree = self.trees.propose(req, k) if self.trees is not None and self._reads_argmax(req) else None
                draft = Draft(tree.tokens) if tree is not None else self.source.propose(req, k)
                if self.draft_policy is not None:  # what a draft step (a tree's: a level) costs on this machine
                    steps = len(draft.tokens) if tree is None else max(tree.depths, default=0)
                    self.draft_policy.observe_drafting(steps, time.perf_counter() - started, reads.get(rid, 0))
                tokens = self._grammar_prefix(req, list(draft.tokens))
                if tokens:
                    self.drafts[rid] = tokens
                    self.draft_probs[rid] = draft.probs

    def other_rows(self, drafting: dict) -> int:
        """Rows the step will run besides one per request that may draft: the other requests'
        uncomputed tokens (prefill chunks; waiting prompts may join), up to the step's token
        budget. A step busy with prefill has no cheap rows to spare for drafts."""
        cap, others = max(self.config.max_num_batched_tokens - len(drafting), 0), 0
        for req in itertools.chain(self.scheduler.running, self.scheduler.waiting):
            if req.request_id not in drafting:
                others += req.num_uncomputed
                if others >= cap:
                    return cap
        return others

    def _trees(self, chunks) -> dict | None:
        return self.trees.layouts(chunks, self.drafts) if self.trees is not None else None

    @staticmethod
    def _grammar_prefix(req: ServedRequest, tokens: list[int]) -> list[int]:
        """A draft cut at the first token the request's grammar forbids: the rows past it would
        be rejected anyway, so they are not worth a place in the step."""
        if req.grammar is None or not tokens:
            return tokens
        try:
            return tokens[:req.grammar.valid_prefix(req.seq.output_ids, tokens)]
        except Exception:  # noqa: BLE001 - it fails again, for this request alone, when it samples
            return []

    def overlap_allowed(self) -> bool:
        return self.source is None  # drafters read every token on the host

    def _run(self, chunks, feed=None):
        """The forward, with the batch's grammar masks filled on a worker thread meanwhile; then
        the `after_forward` hooks."""
        pending = self.mask_prefetcher.start(chunks) if self.mask_prefetcher else None
        if self.draft_policy is not None:  # what the policy fits the step's time against
            self._step_shape = (sum(n for _, n in chunks), all(req.num_uncomputed == 1 for req, _ in chunks))
        try:
            logits = super()._run(chunks, feed)
            if self.source is not None:
                self.last_features = self.source.features_of(self.last_hidden)
            for hook in self.after_forward:
                hook(chunks, self.last_hidden)
            return logits
        finally:
            if pending is not None:
                pending.result()  # the masks are ready (or will fail again when their request samples)

    def _split(self, req, n: int) -> tuple[int, list[int]]:
        """(rows of real tokens, drafts) of a chunk of n rows."""
        drafts = self.drafts.get(req.request_id, [])
        return n - len(drafts), drafts

    def _flatten(self, chunks):
        token_ids, seqs, sample_rows, row = [], [], [], 0
        for req, n in chunks:
            real, drafts = self._split(req, n)
            start = req.num_computed_tokens
            token_ids += req.all_ids[start:start + real] + drafts
            seqs.append((start, n, self.blocks.tables[req.request_id]))
            if start + real == req.num_tokens:  # caught up: the last real row and every draft row sample
                sample_rows += range(row + real - 1, row + n)
            row += n
        return token_ids, seqs, sample_rows

    def _postprocess(self, chunks, logits) -> list[StepOutput]:
        """Drafted chunks are verified one by one; all the others go through stage 04's
        postprocess together, so their rows are sampled in one batched call."""
        outputs, i, row = [], 0, 0  # i: logits rows (sampling rows only); row: hidden rows (all)
        plain, plain_rows = [], []  # draft-free chunks, and the logits rows of those that sample
        # greedy verifications that need no per-row processing read the step's argmax in one sync
        argmax = logits.argmax(-1).tolist() if any(
            self._reads_argmax(req) for req, _ in chunks if self.drafts.get(req.request_id)) else None
        for req, n in chunks:
            real, drafts = self._split(req, n)
            start, row = req.num_computed_tokens, row + n
            if not drafts:  # stage 04's path, after this loop
                if self.source is not None:  # every computed position's feature, prefill chunks included
                    self.source.observe(req, self.last_features[row - n:row], start)
                plain.append((req, n))
                if start + n == req.num_tokens:  # it has a logits row
                    plain_rows.append(i)
                    i += 1
                continue
            rows, i = logits[i:i + len(drafts) + 1], i + len(drafts) + 1
            tree, kept = self.trees.drafted.get(req.request_id) if self.trees else None, None  # kept: rows that stay
            try:
                if tree is not None:  # its accepted path, its nodes' K/V moved next to the root
                    emitted, kept = self.trees.accept(req, start, argmax[i - len(drafts) - 1:i])
                else:
                    emitted = (accept_greedy(argmax[i - len(drafts) - 1:i], drafts) if self._reads_argmax(req)
                               else self._verify(req, rows, drafts))
                self._count(req, drafts, emitted, max(tree.depths) if tree is not None else len(drafts))
            except Exception as e:  # fail this request alone, as stage 04 does
                req.finish_reason, req.error = "error", e
                self.scheduler.finish(req)
                outputs.append(StepOutput(req.request_id, None, e))
                continue
            req.num_computed_tokens += len(emitted)  # the last token + accepted drafts have K/V now
            self.blocks.truncate(req.request_id, req.num_computed_tokens)
            features = self.last_features[row - n:row]
            self.source.observe(req, features[kept] if kept else features[:len(emitted)], start)  # kept rows only
            for event in emit(req.seq, emitted):
                outputs.append(StepOutput(req.request_id, event))
                if event.finish_reason:
                    req.finish_reason = event.finish_reason
                    self.scheduler.finish(req)
                    self._acceptance_rngs.pop(req.request_id, None)
            if not req.finished:
                self.blocks.commit(req.request_id, req.all_ids, req.num_computed_tokens)
        if plain:  # (when nothing was drafted, every logits row is theirs: no gather)
            outputs += super()._postprocess(plain, logits if len(plain_rows) == len(logits) else logits[plain_rows])
        return outputs

    def _verify(self, req, rows: torch.Tensor, drafts: list[int]) -> list[int]:
        seq = req.seq
        target = processed_rows(rows, seq, [drafts[:j] for j in range(len(drafts) + 1)])
        if seq.params.greedy:
            emitted = verify_greedy(target, drafts)
        else:
            rng = self._acceptance_rngs.setdefault(
                req.request_id, torch.Generator(device=rows.device).manual_seed(seq.sampler.seed))
            probs = self.draft_probs.get(req.request_id)  # None: point-mass drafts (prompt lookup)
            emitted = verify_sampled(target, drafts, None if probs is None else probs[:len(drafts)], rng)
        return emitted

    @staticmethod
    def _reads_argmax(req) -> bool:
        return req.seq.params.greedy and samples_on_device(req.seq)  # no processors, penalties, logprobs

    def _count(self, req: Request, drafts: list[int], emitted: list[int], depth: int) -> None:
        """depth: the draft's positions (a chain's length, a tree's depth), as the policy counts them."""
        self.spec_stats.record(len(drafts), len(emitted))
        if self.draft_policy is not None:
            self.draft_policy.record(req.request_id, depth, len(emitted) - 1)
        for position in range(len(emitted) - 1):
            self.accepted_per_position[position] += 1

    def stats(self) -> dict:
        stats = {**super().stats(), "speculative": self.speculative.method, **self.spec_stats.to_json()}
        if self.draft_policy is not None:
            stats["draft_policy"] = self.draft_policy.describe()
        return stats
