"""Stage 04's engine with the hooks disaggregation needs. One class, two roles:

producer (prefill worker)
  add_prefill_request  runs the prompt, samples the FIRST token, then keeps the request's blocks
                       (vLLM's "delayed free") and hands them to the connector (save_kv)
  release / cancel     the blocks go back when the consumer confirms, when the lease expires,
                       or at once when the request is cancelled
consumer (decode worker)
  add_transferred_request
                       takes the prompt and the first token, allocates blocks in ITS OWN pool
                       (reusing its own cached prefix), and loads only the blocks it lacks;
                       the request then joins the scheduler with its prompt already computed,
                       so its prefill forward is skipped and it goes straight to decoding
  service_kv           called every loop: finishes loads, serves pulls, expires leases

Nothing in stage 04 changes: a unified engine is this engine with no transfers.
"""
from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, replace

import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import TokenEvent
from course.s03_paged.paged_attention import PagedAttentionMetadata
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine, QueueFullError, StepOutput
from course.s04_continuous_batching.request import Request, Status

from .holding_scheduler import HoldingScheduler
from .kv_connector import KVConnector, KVLayout, LayerBlocks


@dataclass
class Lease:
    """Blocks a producer keeps for a consumer, until `expires_at` (time.time()) at the latest."""
    request_id: int
    expires_at: float


@dataclass
class PendingLoad:
    """A consumer request waiting for its blocks: neither waiting nor running in the scheduler."""
    request: Request
    params: dict
    first_block: int   # blocks before this one were already in our own prefix cache
    future: Future     # -> LayerBlocks
    deadline: float
    started: float     # time.time() when the load began (kv_origin reports how long it took)


@dataclass
class DisaggConfig:
    lease_s: float = 30.0          # producer: how long blocks wait for a consumer
    kv_load_timeout_s: float = 10.0  # consumer: how long a load may take before we recompute instead


class DisaggEngine(LLMEngine):
    def __init__(self, model, tokenizer, config: EngineConfig | None = None, eos_token_ids=(),
                 connector: KVConnector | None = None, disagg: DisaggConfig | None = None, **kwargs):
        # blocks are shipped as one pool's: sliding layers keep every block beside the full ones (no layer groups)
        config = replace(config or EngineConfig(), layer_groups=False)
        super().__init__(model, tokenizer, config, eos_token_ids, scheduler_cls=HoldingScheduler, **kwargs)
        self.disagg = disagg or DisaggConfig()
        self.connector = connector
        # a prompt's blocks are shipped whole and named in the receiver's prefix cache: none may be
        # released behind a sliding window first (the window still masks attention)
        self.blocks.window = None
        if connector is not None:
            connector.register_kv_cache(self.cache)
        self.layout = KVLayout.of(self.cache)
        # producer state
        self.transfer_of: dict[int, str] = {}      # request id -> transfer id (prefill requests)
        self.leases: dict[str, Lease] = {}          # transfer id -> held blocks
        self.exports: dict[int, dict] = {}          # request id -> transfer params, once its blocks are held
        self.lease_overrides: dict[int, float] = {}  # request id -> its own lease, if it asked for one
        # consumer state
        self.loading: dict[int, PendingLoad] = {}
        self.first_events: dict[int, TokenEvent] = {}  # the handed-over first token's event, to stream
        self.kv_origin: dict[int, dict] = {}        # request id -> how its prompt K/V got here
        self.released = Counter()                   # how leases ended: confirm / expiry / cancel
        self.num_loaded_blocks = 0

    # ==== producer ============================================================================
    def add_prefill_request(self, prompt_ids: list[int], params: SamplingParams, transfer_id: str | None = None,
                            lease_s: float | None = None) -> int:
        """Queue a prompt to run up to its first token; its blocks are then held for a consumer."""
        if transfer_id is not None and (transfer_id in self.leases or transfer_id in self.transfer_of.values()):
            raise ValueError(f"transfer id {transfer_id!r} is already in use")
        rid = self.add_request(prompt_ids, replace(params, max_new_tokens=1))
        self.scheduler.hold_on_finish.add(rid)
        self.transfer_of[rid] = transfer_id or uuid.uuid4().hex
        if lease_s is not None:
            self.lease_overrides[rid] = lease_s
        return rid

    def step(self) -> list[StepOutput]:
        outputs = super().step()
        for i, out in enumerate(outputs):
            req = self.requests[out.request_id]
            if out.request_id in self.scheduler.hold_on_finish and req.finished:
                self.scheduler.hold_on_finish.discard(out.request_id)
                if req.request_id in self.blocks.tables:  # held: finished normally after its first token
                    try:
                        self._export(req)
                    except Exception as e:  # the connector could not take it: fail this request alone
                        self.blocks.free(req.request_id)
                        self.transfer_of.pop(req.request_id, None)
                        self.lease_overrides.pop(req.request_id, None)
                        req.finish_reason, req.error = "error", e
                        outputs[i] = StepOutput(req.request_id, None, e)
                else:  # it failed: nothing to hand over
                    self.transfer_of.pop(out.request_id, None)
                    self.lease_overrides.pop(out.request_id, None)
        return outputs

    def _export(self, req: Request) -> None:
        """The first token is sampled: give the blocks to the connector and start the lease."""
        tid = self.transfer_of[req.request_id]
        blocks = self.blocks.tables[req.request_id]
        saved = self.connector.save_kv(tid, req.seq.prompt_ids, blocks)
        lease_s = self.lease_overrides.pop(req.request_id, self.disagg.lease_s)
        self.leases[tid] = Lease(req.request_id, time.time() + lease_s)
        generator = req.seq.sampler._generator  # sampled requests continue the same random stream
        self.exports[req.request_id] = {
            **saved, "connector": self.connector.name, "transfer_id": tid, "num_blocks": len(blocks),
            "layout": self.layout.to_json(), "lease_s": lease_s, "first_token": req.seq.output_ids[0],
            "sampler_state": generator.get_state().tolist() if generator is not None else None}

    def held_blocks(self, transfer_id: str) -> list[int] | None:
        lease = self.leases.get(transfer_id)
        return self.blocks.tables[lease.request_id] if lease else None

    def release(self, transfer_id: str, why: str) -> bool:
        """Free a lease's blocks (delayed free ends). `why`: confirm, expiry or cancel."""
        lease = self.leases.pop(transfer_id, None)
        if lease is None:
            return False
        self.blocks.free(lease.request_id)
        self.forget(lease.request_id)
        self.transfer_of.pop(lease.request_id, None)
        self.exports.pop(lease.request_id, None)
        self.released[why] += 1
        return True

    def cancel(self, transfer_id: str) -> bool:
        """The client went away: free the blocks now, whether still prefilling or already held."""
        if self.release(transfer_id, "cancel"):
            return True
        for rid, tid in list(self.transfer_of.items()):
            if tid == transfer_id and not self.requests[rid].finished:
                self.scheduler.hold_on_finish.discard(rid)
                self.abort(rid)  # stage 04 frees its blocks at once
                self.forget(rid)
                del self.transfer_of[rid]
                self.lease_overrides.pop(rid, None)
                self.released["cancel"] += 1
                return True
        return False

    # ==== consumer ============================================================================
    def add_transferred_request(self, prompt_ids: list[int], params: SamplingParams, transfer: dict) -> int:
        """A request whose prompt ran elsewhere: `transfer` is what the producer's export said
        (first token, where its blocks are). Returns the request id; the first token's event is
        in `first_events`."""
        seq = self.make_sequence(prompt_ids, params)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the queue is full ({self.config.max_waiting} waiting requests)")
        if transfer.get("sampler_state") is not None:  # continue the producer's random stream
            state = torch.tensor(transfer["sampler_state"], dtype=torch.uint8)
            seq.sampler._generator_for(self.model.device).set_state(state)
        rid = next(self._ids)
        self.requests[rid] = req = Request(rid, seq)
        self.first_events[rid] = event = seq.append(transfer["first_token"])
        if event.finish_reason:  # the first token already ends it: no K/V needed
            req.finish_reason, req.status = event.finish_reason, Status.FINISHED
            self.kv_origin[rid] = {"source": "none"}
            self.connector.confirm(transfer)
            return rid
        if not self.blocks.can_allocate(req.all_ids):  # no room for the K/V now: queue it to recompute later
            return self._recompute(req, transfer, "no free blocks")
        hit_tokens = self.blocks.allocate(rid, req.all_ids)  # our own cached prefix counts, as always
        first_block = hit_tokens // self.config.block_size
        if first_block >= transfer["num_blocks"]:  # every prompt block was cached here already
            self._loaded(req, transfer, first_block, [])
            return rid
        deadline = time.time() + min(self.disagg.kv_load_timeout_s, transfer["lease_s"])
        future = self.connector.start_load(transfer, prompt_ids, first_block, deadline)
        self.loading[rid] = PendingLoad(req, transfer, first_block, future, deadline, time.time())
        return rid

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.loading)

    def service_kv(self, now: float | None = None) -> None:
        """The transfer work of one loop turn: finished loads join the scheduler, failed or late
        ones recompute, pulls are served, confirmed and expired leases are freed."""
        now = time.time() if now is None else now
        for rid, load in list(self.loading.items()):
            if load.request.finished:  # aborted while loading (its blocks are already freed)
                del self.loading[rid]
                self.connector.confirm(load.params)
            elif load.future.done():
                del self.loading[rid]
                try:
                    self._loaded(load.request, load.params, load.first_block, load.future.result())
                    self.kv_origin[rid]["load_s"] = now - load.started  # seen at this turn: an upper bound
                except Exception as e:  # KVTransferError, or anything else the transport raised
                    self._recompute(load.request, load.params, str(e))
            elif now > load.deadline:
                del self.loading[rid]
                self._recompute(load.request, load.params, "the transfer ran past its deadline")
        if self.connector is not None:  # (also when we hold nothing: a late pull must hear "gone")
            for tid in self.connector.poll_producer(self.held_blocks):
                self.release(tid, "confirm")
        for tid, lease in list(self.leases.items()):
            if now > lease.expires_at:
                self.release(tid, "expiry")

    def _loaded(self, req: Request, params: dict, first_block: int, layers: LayerBlocks) -> None:
        """Write the received blocks by OUR slot mapping, then queue the request as resident
        (stage 04's paused state: it holds blocks and resumes without recompute)."""
        n_prompt = len(req.seq.prompt_ids)
        bs = self.config.block_size
        start = first_block * bs
        if start < n_prompt:
            table = self.blocks.tables[req.request_id]
            slots = PagedAttentionMetadata.build([(start, n_prompt - start, table)], bs, self.model.device).slot_mapping
            device = self.cache.k.device  # blocks may arrive in host memory
            for layer, parts in enumerate(layers):  # K and V (and a quantized pool's scales), as sent
                for pool, part in zip(self.cache.tensors(), parts):
                    pool[layer].view(-1, *part.shape[2:])[slots] = part.flatten(0, 1)[:n_prompt - start].to(device)
        self.num_loaded_blocks += len(layers[0][0]) if layers else 0
        req.num_computed_tokens = n_prompt
        self.blocks.commit(req.request_id, req.seq.prompt_ids)  # the loaded full blocks join our prefix cache
        req.status = Status.PAUSED
        self.scheduler.add(req)
        self.kv_origin[req.request_id] = {"source": "remote", "hit_blocks": first_block,
                                          "loaded_blocks": len(layers[0][0]) if layers else 0}
        self.connector.confirm(params)

    def _recompute(self, req: Request, params: dict, why: str) -> int:
        """The K/V did not come (in time): compute the prompt here, as a unified engine would."""
        if req.request_id in self.blocks.tables:
            self.blocks.free(req.request_id)
        req.num_computed_tokens, req.status = 0, Status.WAITING
        self.scheduler.add(req)
        self.kv_origin[req.request_id] = {"source": "recomputed", "why": why}
        self.connector.confirm(params)
        return req.request_id

    # ==== both ================================================================================
    def kv_stats(self) -> dict:
        b = self.blocks
        return {**self.stats(), "held": len(self.leases), "loading": len(self.loading),
                "tables": len(b.tables), "ref_count_sum": sum(blk.ref_count for blk in b.blocks),
                "released": dict(self.released), "loaded_blocks": self.num_loaded_blocks}
