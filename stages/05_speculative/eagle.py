"""EAGLE (Li et al. 2024): draft in feature space, with one decoder layer riding on the target.

The target's final hidden state f_t (what its lm_head reads to predict token t+1) already
knows most of what comes next. The EAGLE head takes, at position t, the pair

    (f_t, embedding of token t+1)  --fc: 2h -> h-->  one decoder layer  -->  f^_{t+1}

and predicts the target's *next feature*; the target's own frozen lm_head turns f^_{t+1} into
a distribution over token t+2. Feeding the token in resolves the uncertainty the feature alone
cannot (which of several likely tokens was actually sampled). To draft k tokens, the head
runs k times, feeding its own predicted feature and drafted token back in ("chain").

The head borrows the target's embedding and lm_head (frozen, not stored) and owns only fc and
one decoder layer: about 4M parameters for SmolLM2-135M. It keeps its own one-layer KV cache
over positions; entries built from true target features are kept across steps, entries from
its own guesses are dropped after each verification.

A reduced draft vocabulary (FR-Spec, Zhao et al. 2025; EAGLE-3): a head may carry
`draft_vocab`, the ids of the tokens it may propose (the target's most frequent outputs).
Drafting then reads only those rows of the target's lm_head (8k of 49k rows: a draft token's
logits cost a sixth), and every other token gets -inf: it is never drafted. Verification is
untouched, so the output stays the target's; a rare token only costs one missed draft.

EAGLE-3 (eagle3.py) keeps this drafting and changes what the head reads and predicts; the two
hooks it overrides are `input_features` and `readout`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from course.s01_decode_loop.attention import AttentionBackend, AttentionMetadata
from course.s01_decode_loop.config import ModelConfig
from course.s01_decode_loop.model import CausalLM, DecoderLayer
from course.s01_decode_loop.rope import RotaryEmbedding
from course.s01_decode_loop.sequence import Sequence
from course.s02_kv_cache.generate import step_metadata
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache

from .drafter import Draft, Drafter, draft_chain
from .tree import Calibration, Tree, TreeAttention, block_metadata, deeper_may_pay, tree_size

EAGLE1_HEAD = Path(__file__).parent / "eagle_smollm2_135m.safetensors"  # training/train_eagle.py --head eagle
# The head that drafts when none is named: the one that drafts best on the held-out prompts
# (README, "The EAGLE heads"): EAGLE-3's (eagle3.py). EagleHead.load reads either kind.
DEFAULT_HEAD = Path(__file__).parent / "eagle3_smollm2_135m.safetensors"


class HeadMismatch(ValueError):
    """A head file that does not fit the target: its tensors' shapes or token ids differ."""


class EagleHead(nn.Module):
    predicts_features = True  # trained to predict the target's next feature (SmoothL1) as well as its token
    tap_layers: tuple[int, ...] = ()  # target layers it reads besides the final hidden state (EAGLE-3)
    # x [n, h] @ rows[V, h].T for the draft vocabulary's logits: an engine may put its own kernel here
    vocab_product = staticmethod(torch.nn.functional.linear)

    def __init__(self, target_config: ModelConfig, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        self.config = dataclasses.replace(target_config, num_hidden_layers=1)
        h = self.config.hidden_size
        self.fc = nn.Linear(2 * h, h)
        self.layer = DecoderLayer(self.config, 0)
        self.rotary_emb = RotaryEmbedding(self.config)
        if draft_vocab is not None:  # a buffer: saved with the head, moved with .to(device)
            self.register_buffer("draft_vocab", torch.as_tensor(draft_vocab, dtype=torch.int64).sort().values)
        else:
            self.draft_vocab = None
        self._draft_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # (lm_head weight, its rows)

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, attn: AttentionBackend,
                meta: AttentionMetadata) -> torch.Tensor:
        """features, token_embeds: [T, h] (f_t and the embedding of token t+1, at position t).
        Returns the predicted next features f^_{t+1}: [T, h]."""
        x = self.fc(torch.cat([token_embeds, features], dim=-1))
        cos, sin = self.rotary_emb(meta.positions)
        return self.layer(x, cos, sin, attn, meta)

    def input_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the head reads from the target's forward: its final hidden states."""
        return hidden

    def readout(self, predicted: torch.Tensor) -> torch.Tensor:
        """What the lm_head reads from the head's output: a predicted final hidden state as is."""
        return predicted

    def draft_logits(self, target: CausalLM, features: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of the head's outputs [n, h] -> [n, vocab]: the target's own
        lm_head, or with a draft vocabulary only its rows (the rest -inf: never drafted)."""
        if self.draft_vocab is None:
            return target.compute_logits(self.readout(features))
        small = self._draft_vocab_logits(target, features)
        full = small.new_full((features.shape[0], self.config.vocab_size), float("-inf"))
        full[:, self.draft_vocab] = small
        return full

    def draft_top(self, target: CausalLM, features: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k likeliest tokens after each output [n, h]: (log-probabilities, token ids), both
        [n, k]. With a draft vocabulary the softmax runs over its rows only (the same values:
        the rest are -inf), not over the whole vocabulary."""
        if self.draft_vocab is None:
            top = torch.log_softmax(self.draft_logits(target, features), dim=-1).topk(k, dim=-1)
            return top.values, top.indices
        top = torch.log_softmax(self._draft_vocab_logits(target, features), dim=-1).topk(k, dim=-1)
        return top.values, self.draft_vocab[top.indices]

    def _draft_vocab_logits(self, target: CausalLM, features: torch.Tensor) -> torch.Tensor:
        weight = target.lm_head.weight
        if self._draft_rows is None or self._draft_rows[0] is not weight:  # sliced once per target
            self._draft_rows = (weight, weight.detach()[self.draft_vocab].contiguous())
        return self.vocab_product(self.readout(features), self._draft_rows[1]).float()

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).detach().contiguous()
                   for k, v in self.state_dict().items()}
        save_file(tensors, str(path), metadata={k: str(v) for k, v in (meta or {}).items()})

    @classmethod
    def load(cls, path: str | Path, target: CausalLM) -> "EagleHead":
        """The head in `path` (EAGLE-1/2, or EAGLE-3 when the file holds a `fuse` layer), for
        `target`; a head made for a model of other shapes raises HeadMismatch naming them."""
        state = load_file(str(path))
        kind = cls
        if "fuse.weight" in state and cls is EagleHead:
            from .eagle3 import Eagle3Head  # the file says which head it is
            kind = Eagle3Head
        options = kind.options_in(state)
        with torch.device("meta"):  # the shapes this model needs, without allocating anything
            expected = {k: tuple(v.shape) for k, v in kind(target.config, **options).state_dict().items()}
        problems = [f"{k} is {tuple(v.shape)}, this model needs {expected[k]}"
                    for k, v in state.items() if k in expected and tuple(v.shape) != expected[k]]
        problems += [f"it has no {k}" for k in expected.keys() - state.keys()]
        problems += [f"{k} belongs to no part of this head" for k in state.keys() - expected.keys()]
        problems += kind.id_problems(state, target.config)
        if problems:
            raise HeadMismatch("; ".join(problems))
        head = kind(target.config, **options)
        head.load_state_dict({k: v.to(target.dtype) if v.is_floating_point() else v for k, v in state.items()})
        return head.to(target.device).eval()

    @staticmethod
    def options_in(state: dict) -> dict:
        """Constructor options a saved state carries (its buffers)."""
        return {"draft_vocab": state.get("draft_vocab")}

    @staticmethod
    def id_problems(state: dict, config: ModelConfig) -> list[str]:
        vocab = state.get("draft_vocab")
        if vocab is not None and vocab.numel() and int(vocab.max()) >= config.vocab_size:
            return [f"it drafts token id {int(vocab.max())}, this model's vocabulary has {config.vocab_size}"]
        return []


# Positions a draft writes into the head's cache past the known ones: a chain's k, a tree's
# expanded nodes (top_k a level). The buffers always keep this much room past the known positions.
DRAFT_ROOM = 64


class EagleDrafter(Drafter):
    """Drafts with the head: a chain (k steps, each feeding back its own feature and token) or
    an EAGLE-2 tree (`propose_tree`)."""
    name = "eagle"

    def __init__(self, head: EagleHead, target: CausalLM, calibration: Calibration | None = None):
        self.head, self.target = head, target
        self.calibration = calibration if calibration is not None else Calibration()  # trees' chances
        self.generator = torch.Generator(device=target.device)
        self.features: torch.Tensor | None = None  # [capacity, h]: the target's f_t by position
        self.num_features = 0                      # positions 0 .. num_features-1 are known
        self.cache: KVCache | None = None          # the head's own K/V, one layer
        if head.tap_layers:  # the target's forward keeps the layers the head reads
            target.tap_layers = head.tap_layers

    @torch.no_grad()  # an EAGLE-3 head fuses the taps here, once for all the forward's rows: no graph to keep
    def features_of(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.input_features(self.target.tapped if self.head.tap_layers else hidden)

    def begin(self, seq: Sequence) -> None:
        self.generator.manual_seed(seq.sampler.seed + 1)  # not the acceptance draws' stream
        self.num_features = 0

    def observe(self, features: torch.Tensor, start: int) -> None:
        end = start + features.shape[0]
        if self.features is None or end + DRAFT_ROOM > self.features.shape[0]:
            capacity = max(2 * end + DRAFT_ROOM, 256)
            grown = features.new_zeros(capacity, self.head.config.hidden_size)
            if self.features is not None and start > 0:
                grown[:start] = self.features[:start]
            self.features = grown
            self.cache = KVCache(self.head.config, capacity, features.dtype, features.device)
        self.features[start:end] = features
        self.num_features = end
        # head entries at positions >= start were built on guesses, on tokens now replaced, or
        # (start == 0) on another request
        self.cache.num_tokens = min(self.cache.num_tokens, start)

    def _catch_up(self, seq: Sequence) -> torch.Tensor:
        """Feed the head the pairs (f_t, token t+1) it has not seen; they exist for
        t < num_features (the last token's feature comes with the next verification). Returns
        the predicted feature of the last token's position, [h]; the head cache then holds only
        entries built on true features."""
        first, last = self.cache.num_tokens, self.num_features - 1
        tokens = torch.tensor(seq.all_ids[first + 1:last + 2], device=self.features.device)
        return self._step(self.features[first:last + 1], tokens, first)[-1]

    @torch.no_grad()
    def propose(self, seq: Sequence, k: int) -> Draft:
        if k == 0:
            return Draft([])
        if k > DRAFT_ROOM:
            raise ValueError(f"k={k}: an EAGLE chain drafts at most {DRAFT_ROOM} tokens")
        predicted, position = self._catch_up(seq), self.num_features

        def after(i: int, token: int) -> torch.Tensor:  # feed the guess back: its feature and token
            nonlocal predicted
            token_ids = torch.tensor([token], device=predicted.device)
            predicted = self._step(predicted[None], token_ids, position + i)[-1]
            return self.head.draft_logits(self.target, predicted[None])[0]

        return draft_chain(self.head.draft_logits(self.target, predicted[None])[0], after, k, seq, self.generator)

    @torch.no_grad()
    def propose_tree(self, seq: Sequence, depth: int, top_k: int = 4, max_nodes: int = 16, cost=None) -> Tree:
        """EAGLE-2 drafting: expand the top_k most confident nodes of each level (top_k children
        each), `depth` levels deep, then keep the max_nodes best-scoring nodes (score = summed
        log-probability of the path; a child never outscores its parent, so the kept set is a
        tree). With `cost` (a VerifyCost), keep only as many as pay for their verify (tree_size),
        judged by the calibrated chances (the kept order too: they may rank a deep node above a
        shallow sibling's, never above its parent), and stop a level early when no node of it
        could pay for its drafting (deeper_may_pay)."""
        if depth == 0:
            return Tree()
        if top_k * (depth - 1) > DRAFT_ROOM:
            raise ValueError(f"a tree {depth} deep expanding {top_k} a level drafts past {DRAFT_ROOM} positions")
        started = time.perf_counter()
        root_feature = self._catch_up(seq)
        true_len, last = self.cache.num_tokens, self.num_features - 1  # drafting entries go after true_len
        tree, scores, feature_in, slots = Tree(), [], {}, []  # slots: node expanded at each slot
        chances = []  # calibrated, parents before children

        def add_children(parents: list[int], predicted: torch.Tensor) -> list[int]:
            """top_k children for each parent (-1: the root) from the head's outputs [n, h], one
            lm_head product for all of them."""
            values, ids = self.head.draft_top(self.target, predicted, top_k)
            born = []
            for parent, feature, values, ids in zip(parents, predicted, values.tolist(), ids.tolist()):
                for lp, tok in zip(values, ids):
                    born.append(tree.add(tok, parent))
                    scores.append((scores[parent] if parent >= 0 else 0.0) + lp)
                    chances.append(self.calibration.chance(scores[-1], tree.depths[-1],
                                                           chances[parent] if parent >= 0 else 1.0))
                    feature_in[born[-1]] = feature
            return born

        frontier = add_children([-1], root_feature[None])
        level_started = started
        for _ in range(depth - 1):
            now = time.perf_counter()
            if cost is not None and not deeper_may_pay(chances, max(chances[u] for u in frontier), cost, max_nodes,
                                                       now - started, now - level_started):
                break
            level_started = now
            expand = sorted(frontier, key=lambda u: -scores[u])[:top_k]
            ancestors = [set(tree.path_to(u)) for u in expand]
            seen = torch.tensor([[slot in anc for slot in slots] for anc in ancestors], dtype=torch.bool)
            mask = torch.cat([seen.reshape(len(expand), len(slots)), torch.eye(len(expand), dtype=torch.bool)], 1)
            start = self.cache.num_tokens
            positions = [last + tree.depths[u] for u in expand]  # the head reads (f_t, token t+1) at t
            embeds = self.target.model.embed_tokens(torch.tensor([tree.tokens[u] for u in expand],
                                                                  device=root_feature.device))
            out = self.head(torch.stack([feature_in[u] for u in expand]), embeds,
                            TreeAttention(self.cache, true_len, mask), block_metadata(start, positions, embeds.device))
            slots += expand
            frontier = add_children(expand, out)
        self.cache.num_tokens = true_len  # drop the drafting entries
        if cost is not None:
            max_nodes = tree_size(chances, cost, max_nodes, drafting=time.perf_counter() - started)
        keep = sorted(sorted(range(len(tree)), key=lambda u: -chances[u])[:max_nodes])
        kept, index = Tree(), {}
        for u in keep:  # creation order: parents before children
            if tree.parents[u] >= 0 and tree.parents[u] not in index:
                continue  # a tie cut the parent: drop the orphan
            index[u] = kept.add(tree.tokens[u], index.get(tree.parents[u], -1), chance=math.exp(scores[u]))
        return kept

    def _step(self, features: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
        meta = step_metadata(start, features.shape[0], features.device)
        embeds = self.target.model.embed_tokens(tokens)
        return self.head(features, embeds, ContiguousKVAttention(self.cache), meta)
