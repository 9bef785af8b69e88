"""Stage 04's engine with stage 06's runner: the attention backend picked by name, graphs replayed.

    schedule -> ModelRunner.run (persistent buffers, backend metadata, graph or eager) -> postprocess

Scheduling, the block manager and sampling are stage 04's: only `_run` changes. The pool gets
one block more than the block manager hands out, the dummy block graph padding rows write to.
Rooms plug in by name: a backend (`register_backend`), and an `Extension` for the config
options marked as theirs (`register_extension`; its hooks name the room that uses each).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch
from torch import nn

from course.s01_decode_loop.model import CausalLM
from course.s03_paged.layer_groups import layer_groups
from course.s04_continuous_batching.engine import EngineConfig, StepOutput
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine

from .backend_base import KernelBackend
from .fused_model import FusedCausalLM
from .graph_runner import GraphRunner
from .model_runner import ModelRunner
from .step_inputs import Feed
from .torch_backend import TorchPagedBackend
from .triton_backend import TritonPagedBackend

# attention backends by name (`attention_backend`); a room adds its own (the cpu room's "cpu")
BACKENDS: dict[str, type[KernelBackend]] = {"torch": TorchPagedBackend, "triton": TritonPagedBackend}


def register_backend(backend: type[KernelBackend]) -> None:
    BACKENDS[backend.name] = backend


def make_backend(name: str, cache, config=None) -> KernelBackend:
    """The backend called `name` on `cache`; with the engine's config, built as it asks."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)} "
                         "(a room's needs the room registered: python -m course.s06_kernels_graphs does it)")
    return BACKENDS[name].from_config(cache, config) if config is not None else BACKENDS[name](cache)


def room_option(default, room: str):  # a config field that the named room reads
    return field(default=default, metadata={"room": room})


@dataclass
class KernelEngineConfig(EngineConfig):
    attention_backend: str = "torch"     # "torch", "triton", or a room's ("cpu")
    cuda_graphs: bool = False            # replay steps from captured graphs (CPU: the eager stand-in)
    graph_max_batch: int | None = None   # largest captured bucket (default: max_num_seqs)
    graph_max_seq_len: int = 2048        # steps with a longer sequence run eagerly
    num_splits: int | None = None        # Triton decode split-K partitions (None: chosen per step)
    triton_kernels: str = "lesson"       # the Triton backend's kernel set: "lesson", or a room's ("gpu")
    fused: bool = False                  # merged QKV/gate-up weights, fused add+RMSNorm and RoPE (fused_model.py)
    # options the rooms read (python -m course.s06_kernels_graphs registers every room)
    overlap: bool = room_option(False, "overlap")         # launch a decode step before reading the last's tokens
    graph_max_num_tokens: int = room_option(512, "mixed_graphs")  # graphs for steps of up to this many tokens
    linear_splits: int = room_option(1, "cpu")            # each fused linear as a bmm over this many row blocks
    quantization: str | None = room_option(None, "cpu")   # "int8": int8 weight-only fused linears
    one_call_layers: bool = room_option(True, "cpu")      # cpu backend: each layer of a step in one C call


class Extension:
    """What a room adds to the engine while its options are set; each default changes nothing."""

    def prepare_module(self, module: nn.Module, draft: bool = False) -> nn.Module:  # its linears (cpu/)
        return module  # draft: only guesses the target verifies (an EAGLE head): may be stored coarser

    def graph_runner(self, model, backend, **shape) -> GraphRunner | None:  # more kinds of step (mixed_graphs/)
        return None

    def step(self) -> list[StepOutput] | None:  # one engine step this room's way (overlap/); None: the engine's
        return None

    def in_flight(self) -> bool:  # work launched whose results the engine has not read yet
        return False

    def stats(self) -> dict:
        return {}


# room -> make(engine): its Extension, or None where the config leaves the room's options unset
EXTENSIONS: dict[str, Callable[["LLMEngine"], Extension | None]] = {}


def register_extension(room: str, make: Callable[["LLMEngine"], Extension | None]) -> None:
    EXTENSIONS[room] = make


class LLMEngine(BatchingEngine):
    reserved_blocks = 1  # the dummy block: id num_blocks

    def __init__(self, model, tokenizer, config: KernelEngineConfig | None = None, eos_token_ids=(), **kw):
        config = config or KernelEngineConfig()
        # a graph captures one block table a step, so every layer shares it (no layer groups)
        config = replace(config, layer_groups=config.layer_groups and not config.cuda_graphs)
        if type(model) is not CausalLM or (config.layer_groups and layer_groups(model.config.layer_windows)):
            config = replace(config, fused=False)  # a family's own forward (stage 01's families/), or layer groups
        super().__init__(FusedCausalLM(model) if config.fused else model, tokenizer, config, eos_token_ids, **kw)
        self.extensions = self.make_extensions()
        model = self.prepare_module(self.model)
        self.attn = make_backend(config.attention_backend, self.cache, config)
        if config.fused:  # the backend's ops, and its whole-layer kernels where it offers them
            model.follow(self.attn)
        dummy, graphs = config.num_blocks, None
        if config.cuda_graphs:  # the lesson's decode graphs, or a room's runner that captures more kinds of step
            shape = dict(max_batch=config.graph_max_batch or config.max_num_seqs, dummy_block=dummy,
                         max_seq_len=min(config.graph_max_seq_len, self.max_model_len))
            rooms = [g for e in self.extensions.values() if (g := e.graph_runner(model, self.attn, **shape))]
            graphs = rooms[0] if rooms else GraphRunner(model, self.attn, **shape)
        self.runner = ModelRunner(model, self.attn, max_num_tokens=max(config.max_num_batched_tokens, config.max_num_seqs),
                                  max_num_seqs=config.max_num_seqs,
                                  max_blocks_per_seq=-(-self.max_model_len // config.block_size),
                                  dummy_block=dummy, graphs=graphs,
                                  group_dummies=[g.num_blocks for g in self.blocks.groups[1:]] if self.layer_groups else ())
        self.graphed_steps = 0

    def make_extensions(self) -> dict[str, Extension]:
        """The registered rooms' extensions; an option set for a room nobody registered is refused."""
        for f in fields(self.config):
            if "room" in f.metadata and getattr(self.config, f.name) != f.default and f.metadata["room"] not in EXTENSIONS:
                raise ValueError(f"{f.name} is the {f.metadata['room']} room's option: register it first "
                                 f"(course.s06_kernels_graphs.{f.metadata['room']}.register())")
        made = {room: make(self) for room, make in EXTENSIONS.items()}
        return {room: extension for room, extension in made.items() if extension is not None}

    def prepare_module(self, module: nn.Module, draft: bool = False) -> nn.Module:
        """Apply to `module` (the fused model; an extra one, a draft head with `draft`) what the
        registered options do to the model's linears (the CPU room's split or int8); unchanged
        where none."""
        for extension in self.extensions.values():
            module = extension.prepare_module(module, draft)
        return module

    @torch.no_grad()
    def warm_up(self) -> int:
        """Capture every graph bucket now, not while the first request waits (on CUDA the captures
        compile the Triton kernels too). Returns how many graphs are held (0 without graphs)."""
        graphs = self.runner.graphs
        if graphs is not None and not graphs.graphs:
            graphs.capture_all()
        return graphs.held() if graphs else 0

    def step(self):
        for extension in self.extensions.values():
            if (outputs := extension.step()) is not None:
                return outputs
        return super().step()

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or any(e.in_flight() for e in self.extensions.values())

    def overlap_allowed(self) -> bool:
        """May a step launch before the last one's tokens are read? (Not where drafts come from them.)"""
        return True

    def _run(self, chunks, feed: Feed | None = None):
        token_ids, seqs, sample_rows = self._flatten(chunks)
        groups = self.blocks.group_seqs(seqs, [req.request_id for req, _ in chunks]) if self.layer_groups else None
        out = self.runner.run(token_ids, seqs, sample_rows, feed, self._trees(chunks), groups)
        self.graphed_steps += out.graphed
        self.last_hidden = out.hidden  # every row's final hidden state: drafters (final/'s EAGLE) read it
        return out.logits

    def _trees(self, chunks) -> dict | None:
        """The step's speculative trees for the runner (none here: final/'s engine drafts them)."""
        return None

    def stats(self) -> dict:
        extras = {k: v for e in self.extensions.values() for k, v in e.stats().items()}
        return {**super().stats(), "backend": self.attn.name, "graphed_steps": self.graphed_steps, **extras}
