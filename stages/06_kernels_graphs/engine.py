"""Stage 04's engine with stage 06's runner: the attention backend is picked by name in the
config, and steps can replay captured graphs.

    schedule -> ModelRunner.run (persistent buffers, backend metadata, graph or eager) -> postprocess

Scheduling, the block manager and sampling are stage 04's, untouched: only `_run` changes.
The pool gets one block more than the block manager hands out, the dummy block that graph
padding rows write to.
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field, replace

import torch

from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine

from .backends import make_backend
from .cpu.settings import CpuSettings
from .fused_model import FusedCausalLM
from .graph_runner import GraphRunner
from .model_runner import Feed, ModelRunner
from .overlap import OverlapScheduler


@dataclass
class KernelEngineConfig(EngineConfig):
    attention_backend: str = "torch"     # "torch" (PyTorch, stage 03's math), "cpu" (cpu/attention.c) or
                                         # "triton" (this stage's kernels)
    cuda_graphs: bool = False            # replay steps from captured graphs (CPU: the eager stand-in)
    graph_max_batch: int | None = None   # largest captured bucket (default: max_num_seqs)
    graph_max_seq_len: int = 2048        # steps with a longer sequence run eagerly
    graph_max_num_tokens: int = 512      # largest token bucket of captured mixed steps (prefill chunks,
                                         # verifications); 0: capture decode steps only
    num_splits: int | None = None        # Triton decode split-K partitions (None: chosen per step)
    triton_kernels: str = "gpu"          # "gpu" (gpu/: tensor cores, shape-only grids) or "lesson"
    fused: bool = False                  # merged QKV/gate-up weights, fused add+RMSNorm and RoPE (fused_model.py)
    overlap: bool = False                # launch a steady decode step before reading the last one's tokens (overlap/)
    cpu: CpuSettings = field(default_factory=CpuSettings)  # what only the CPU needs (cpu/settings.py)
    # the CPU settings may also be given one by one (final/'s command line does): they land in `cpu`
    linear_splits: InitVar[int | None] = None
    quantization: InitVar[str | None] = None
    one_call_layers: InitVar[bool | None] = None

    def __post_init__(self, linear_splits, quantization, one_call_layers):
        given = {"linear_splits": linear_splits, "quantization": quantization, "one_call_layers": one_call_layers}
        self.cpu = replace(self.cpu, **{k: v for k, v in given.items() if v is not None})
        for option in self.cpu.changed_linears():
            if not self.fused:
                raise ValueError(f"{option} needs fused=True: the changed layers belong to the fused copy, "
                                 "never to the model you passed in")


# Read back, the one-by-one names are the CPU settings' own: `config.linear_splits` is
# `config.cpu.linear_splits`, never the keyword's unset default.
for _name in ("linear_splits", "quantization", "one_call_layers"):
    setattr(KernelEngineConfig, _name, property(lambda self, name=_name: getattr(self.cpu, name)))


class LLMEngine(BatchingEngine):
    reserved_blocks = 1  # the dummy block: id num_blocks

    def __init__(self, model, tokenizer, config: KernelEngineConfig | None = None, eos_token_ids=(), **kw):
        config = config or KernelEngineConfig()
        if config.fused:  # same weights, fewer kernels; int8 or split linears where the CPU settings say
            model = config.cpu.prepare(FusedCausalLM(model))
        super().__init__(model, tokenizer, config, eos_token_ids, **kw)
        options = {"triton": {"num_splits": config.num_splits, "kernels": config.triton_kernels}, "cpu": {"settings": config.cpu}}
        self.attn = make_backend(config.attention_backend, self.cache, **options.get(config.attention_backend, {}))
        if config.fused:  # the backend's ops, and its whole-layer kernels where it offers them
            model.follow(self.attn)
        dummy = config.num_blocks
        graphs = None
        if config.cuda_graphs:
            graphs = GraphRunner(model, self.attn, max_batch=config.graph_max_batch or config.max_num_seqs,
                                 max_seq_len=min(config.graph_max_seq_len, self.max_model_len), dummy_block=dummy,
                                 max_num_tokens=min(config.graph_max_num_tokens, config.max_num_batched_tokens))
        self.runner = ModelRunner(model, self.attn, max_num_tokens=max(config.max_num_batched_tokens, config.max_num_seqs),
                                  max_num_seqs=config.max_num_seqs,
                                  max_blocks_per_seq=-(-self.max_model_len // config.block_size),
                                  dummy_block=dummy, graphs=graphs)
        self.graphed_steps = 0
        self.overlap = OverlapScheduler(self) if config.overlap else None

    @torch.no_grad()
    def warm_up(self) -> int:
        """Capture every graph bucket now, before any request: otherwise the first step of each
        kind captures them (and, on CUDA, compiles the Triton kernels) while a request waits.
        Returns how many buckets are held (0 without graphs)."""
        graphs = self.runner.graphs
        if graphs is None:
            return 0
        if not graphs.graphs:
            graphs.capture_all()
        return len(graphs.graphs) + len(graphs.mixed_graphs)

    def step(self):
        return self.overlap.step() if self.overlap else super().step()

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.overlap and self.overlap.inflight)

    def overlap_allowed(self) -> bool:
        """May a step be launched before the previous one's tokens are read? (An engine that
        drafts from those tokens says no.)"""
        return True

    def _run(self, chunks, feed: Feed | None = None):
        out = self.runner.run(*self._flatten(chunks), feed)
        self.graphed_steps += out.graphed
        self.last_hidden = out.hidden  # every row's final hidden state: drafters (final/'s EAGLE) read it
        return out.logits

    def stats(self) -> dict:
        overlapped = {"overlapped_steps": self.overlap.deferred_steps} if self.overlap else {}
        return {**super().stats(), "backend": self.attn.name, "graphed_steps": self.graphed_steps, **overlapped}
