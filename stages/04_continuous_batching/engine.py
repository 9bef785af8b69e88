"""LLMEngine: many requests, one forward pass per iteration.

    step() = schedule -> run -> postprocess

* schedule: the Scheduler picks (request, number of tokens) pairs under a token budget;
* run: their tokens are flattened into ONE ragged batch (prefill chunks and single-token
  decodes side by side) and go through the model with stage 03's paged attention;
* postprocess: every request whose tokens are all computed samples its next token (one batched
  call for all of them; a seeded request draws from its own generator, so its output does not
  depend on its neighbours; the unseeded ones share the engine's generator, one draw per step),
  streams the text, and is retired when it finishes; its blocks go back to the pool at once.
"""
from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass

import torch

from course.s01_decode_loop.model import CausalLM
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import GenerationOutput, Sequence, TokenEvent
from course.s03_paged.block_manager import BlockManager, uniform_window
from course.s03_paged.engine import check_fits
from course.s03_paged.layer_groups import GroupedBlocks, GroupedKVCache, group_blocks, group_metadata, layer_groups
from course.s03_paged.paged_attention import PagedAttention, PagedAttentionMetadata, PagedKVCache
from course.s03_paged.quantized_kv import storage_dtype

from .batch_sampler import sample_batch
from .priority_scheduler import PriorityScheduler
from .request import Request
from .scheduler import Scheduler, SchedulingPolicy


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; try again later (a server answers 429)."""


@dataclass
class EngineConfig:
    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 32              # requests running at once
    max_num_batched_tokens: int = 256   # tokens per forward pass (the budget)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    max_model_len: int | None = None    # default: the model's max_position_embeddings
    max_waiting: int = 1024             # queue bound: admission control
    record_steps: bool = True           # keep step_log (tests, notebooks); a long-running server turns it off
    kv_cache_dtype: str = "auto"        # what the pool stores: auto (the model's dtype), bfloat16, int8, fp8
    layer_groups: bool = True           # sliding layers beside full ones: a pool each (False: one, every block kept)


@dataclass
class StepOutput:
    request_id: int
    event: TokenEvent | None
    error: Exception | None = None  # this request alone failed (event is None); it is finished


class LLMEngine:
    reserved_blocks = 0  # pool blocks outside the BlockManager's reach (see __init__)

    def __init__(self, model: CausalLM, tokenizer, config: EngineConfig | None = None, eos_token_ids=(),
                 policy: SchedulingPolicy | None = None, scheduler_cls: type[Scheduler] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        self.eos_token_ids = list(eos_token_ids)
        self.max_model_len = config.max_model_len or model.config.max_position_embeddings
        # the pool may hold a few blocks more than the BlockManager hands out (stage 06 keeps one
        # as the write target of CUDA-graph padding rows): ids num_blocks.. are never allocated
        kv_dtype = storage_dtype(config.kv_cache_dtype, model.dtype)
        self.layer_groups = layer_groups(model.config.layer_windows) if config.layer_groups else []
        if self.layer_groups:  # sliding layers beside full ones: a pool and tables per group (layer_groups.py)
            sizes = group_blocks(self.layer_groups, config.num_blocks, config.block_size, config.max_num_seqs,
                                 config.max_num_batched_tokens)
            self.cache = GroupedKVCache(model.config, self.layer_groups, [n + self.reserved_blocks for n in sizes],
                                        config.block_size, model.dtype, model.device, kv_dtype)
            self.blocks = GroupedBlocks([BlockManager(n, config.block_size, config.enable_prefix_caching, window=w)
                                         for n, (w, _) in zip(sizes, self.layer_groups)])
        else:  # a model whose every layer slides over one window lets blocks behind it go (block_manager.py)
            self.cache = PagedKVCache(model.config, config.num_blocks + self.reserved_blocks, config.block_size,
                                      model.dtype, model.device, kv_dtype)
            self.blocks = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching,
                                       window=uniform_window(model.config.layer_windows))
        self.attn = PagedAttention(self.cache)
        if scheduler_cls is None:  # FCFS by default; a policy that displaces needs the scheduler that can
            scheduler_cls = PriorityScheduler if policy is not None and policy.displaces else Scheduler
        self.scheduler = scheduler_cls(self.blocks, config.max_num_seqs, config.max_num_batched_tokens,
                                       config.enable_chunked_prefill, policy)
        self.requests: dict[int, Request] = {}
        self._ids = itertools.count()
        self.step_log: list[dict] = []  # what each step scheduled (tests assert on it)
        # every unseeded request's sampling noise, drawn for all of them in one call per step
        self.unseeded_generator = torch.Generator(device=model.device).manual_seed(secrets.randbits(63))

    # ---- the API --------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams, priority: int = 0) -> int:
        """Queue a request; refuse at once (nothing allocated) what can never run or finds the
        queue full. `priority` matters only to a policy that reads it (lower first)."""
        seq = self.make_sequence(prompt_ids, params)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the queue is full ({self.config.max_waiting} waiting requests)")
        return self.add_sequence(seq, priority)

    def make_sequence(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """A request's Sequence, or ValueError / CacheCapacityError if it can never run. Reads
        only fixed sizes, so a server may call it on its own thread, before queueing anything."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        seq = Sequence(prompt_ids, params, self.tokenizer, self.eos_token_ids)
        check_fits(seq, self.max_model_len, self.blocks)
        if not self.config.enable_chunked_prefill and len(prompt_ids) > self.config.max_num_batched_tokens:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; with chunked prefill off a prompt must fit "
                             f"one step's budget (max_num_batched_tokens={self.config.max_num_batched_tokens})")
        return seq

    def add_sequence(self, seq: Sequence, priority: int = 0) -> int:
        """Queue a Sequence from `make_sequence`, with no queue bound: the caller applies its own."""
        rid = next(self._ids)
        self.requests[rid] = req = Request(rid, seq, priority=priority)
        self.scheduler.add(req)
        return rid

    def abort(self, request_id: int) -> None:
        """Stop a request now (a client went away): its blocks are freed at once."""
        req = self.requests.get(request_id)
        if req and not req.finished:
            req.finish_reason = "abort"
            self.scheduler.finish(req)

    def forget(self, request_id: int) -> None:
        """Drop a finished request's record: `generate` reads outputs from `self.requests`, but a
        server that runs for days must not keep every request it ever served."""
        req = self.requests.get(request_id)
        if req and req.finished:
            del self.requests[request_id]

    def output(self, request_id: int) -> GenerationOutput:
        """What a request has produced so far (all of it once it has finished)."""
        return self.requests[request_id].seq.output()

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    def step(self) -> list[StepOutput]:
        chunks = self._schedule()
        if not chunks:
            return []
        logits = self._run(chunks)
        return self._postprocess(chunks, logits)

    def _schedule(self) -> list[tuple[Request, int]]:
        """The scheduler's (request, number of tokens) pairs for this step, timed and logged."""
        sched = self.scheduler.schedule()
        now = time.perf_counter()
        for req, _ in sched.chunks:
            req.first_scheduled_time = req.first_scheduled_time or now
        if self.config.record_steps and sched.chunks:
            self.step_log.append({"chunks": [(r.request_id, n, r.num_computed_tokens) for r, n in sched.chunks],
                                  "preempted": [r.request_id for r in sched.preempted]})
        return sched.chunks

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[GenerationOutput]:
        """Offline batch: submit everything, step until all are done, outputs in prompt order."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        while self.has_unfinished():
            self.step()
        for i in ids:
            if self.requests[i].error is not None:
                raise self.requests[i].error
        return [self.output(i) for i in ids]

    # ---- run and postprocess --------------------------------------------------------------
    def _flatten(self, chunks: list[tuple[Request, int]]) -> tuple[list[int], list[tuple[int, int, list[int]]], list[int]]:
        """The ragged batch on the host: every new token id in order, (num_cached, num_new,
        block_table) per sequence, and the rows whose logits will be sampled."""
        token_ids, seqs, sample_rows, row = [], [], [], 0
        for req, n in chunks:
            start = req.num_computed_tokens
            token_ids += req.all_ids[start:start + n]
            seqs.append((start, n, self.blocks.tables[req.request_id]))
            row += n
            if start + n == req.num_tokens:  # caught up: this chunk's last row predicts the next token
                sample_rows.append(row - 1)
        return token_ids, seqs, sample_rows

    @torch.no_grad()
    def _run(self, chunks: list[tuple[Request, int]]) -> torch.Tensor:
        """One forward over the ragged batch; logits only for rows that will sample."""
        token_ids, seqs, sample_rows = self._flatten(chunks)
        build = lambda s: PagedAttentionMetadata.build(s, self.config.block_size, self.model.device)  # noqa: E731
        meta = build(seqs)
        if self.layer_groups:  # each group's layers read their own tables
            others = self.blocks.group_seqs(seqs, [req.request_id for req, _ in chunks])
            meta = group_metadata(meta, [build(s) for s in others], self.cache)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.model.device)
        hidden = self.model(ids, self.attn, meta)
        return self.model.compute_logits(hidden[sample_rows]) if sample_rows else hidden.new_empty(0)

    def _postprocess(self, chunks, logits) -> list[StepOutput]:
        """Advance every chunk; the requests that caught up sample their next tokens in ONE call
        (batch_sampler.py), then each appends, streams and maybe finishes on its own."""
        sampling = []  # requests with a logits row, in row order
        for req, n in chunks:
            req.num_computed_tokens += n
            self.blocks.commit(req.request_id, req.all_ids, req.num_computed_tokens)
            if req.num_computed_tokens == req.num_tokens:  # not a prefill chunk short of the end
                sampling.append(req)
        outputs = []
        samples = sample_batch(logits, [req.seq for req in sampling], self.unseeded_generator) if sampling else []
        for req, sample in zip(sampling, samples):
            try:
                if isinstance(sample, Exception):  # its processor raised inside sample_batch
                    raise sample
                event = req.seq.append(sample.token_id)
                event.logprob, event.top_logprobs = sample.logprob, sample.top_logprobs
            except Exception as e:  # one request's sampling failed (e.g. its logits processor):
                req.finish_reason, req.error = "error", e  # fail it alone; its batch neighbours go on
                self.scheduler.finish(req)
                outputs.append(StepOutput(req.request_id, None, e))
                continue
            outputs.append(StepOutput(req.request_id, event))
            if event.finish_reason:
                req.finish_reason = event.finish_reason
                self.scheduler.finish(req)
        return outputs

    def stats(self) -> dict:
        b = self.blocks
        pool = b.fullest if self.layer_groups else b  # layer groups: the group with the least room left
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "free_blocks": pool.num_free_blocks, "num_blocks": pool.num_blocks,
                "prefix_hit_tokens": b.prefix_hit_tokens, "preemptions": self.scheduler.num_preemptions}
