"""Speculation inside the continuous batch: every request gets exactly the tokens it gets without
speculation, while requests accept different lengths in one step, finish inside an accepted run,
prefill in chunks beside drafted decodes, hit the prefix cache and get preempted."""
import pytest
import torch

from course.final.drafters import DraftSource, EagleSource, make_source
from course.final.engine import Engine, SpeculativeConfig
from course.final.speculation.trees import TreeDrafting
from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.testing import TINY_EOS, tiny_model
from course.s04_continuous_batching.engine import EngineConfig
from course.s04_continuous_batching.engine import LLMEngine as BatchingEngine
from course.s05_speculative.drafter import Draft, Drafter
from course.s05_speculative.eagle import EagleHead
from course.s05_speculative.eagle3 import Eagle3Head
from course.s05_speculative.tree import Calibration, Tree
from course.s06_kernels_graphs.engine import KernelEngineConfig

SHARED = b"You are a helpful assistant. "
PROMPTS = [SHARED + b"abcabcabc", b"a", SHARED + b"the cat sat on the mat, the cat", b"0123456789" * 2, b"xyzxyz"]
POOLS = {"roomy": 64, "tight": 22}


class OracleDrafter(Drafter):
    """Proposes each request's true continuation (from a run without speculation), corrupted
    at chosen output positions, so acceptance lengths differ from request to request."""

    name = "oracle"

    def __init__(self, truth: dict[tuple, list[int]], wrong_every: int):
        self.truth, self.wrong_every = truth, wrong_every

    def propose(self, seq, k):
        future = self.truth[tuple(seq.prompt_ids)][len(seq.output_ids):][:k]
        done = len(seq.output_ids)
        return Draft([t if (done + i) % self.wrong_every else (t + 1) % 256 for i, t in enumerate(future)])


def reference(model, tok, params, pool):
    engine = BatchingEngine(model, tok, EngineConfig(num_blocks=POOLS[pool], block_size=4, max_num_seqs=4,
                                                     max_num_batched_tokens=12), [TINY_EOS])
    return [o.token_ids for o in engine.generate([list(p) for p in PROMPTS], params)]


def speculative(model, tok, params, pool, drafter=None, k=4, backend="torch", **spec):
    config = KernelEngineConfig(num_blocks=POOLS[pool], block_size=4, max_num_seqs=4, max_num_batched_tokens=12,
                                attention_backend=backend)
    engine = Engine(model, tok, config, [TINY_EOS], SpeculativeConfig("lookup", k, **spec), drafter=drafter)
    accepted_per_step, engine.mixed_steps = [], 0
    ids = [engine.add_request(list(p), params) for p in PROMPTS]
    while engine.has_unfinished():
        before = {r: len(engine.requests[r].seq.output_ids) for r in ids}
        engine.step()
        accepted_per_step.append({r: len(engine.requests[r].seq.output_ids) - before[r] for r in ids})
        prefilling = [r for r, _, _ in engine.step_log[-1]["chunks"] if before[r] == 0]
        engine.mixed_steps += bool(prefilling and any(engine.drafts.values()))
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks  # the pool is whole again
    return [engine.requests[r].seq.output_ids for r in ids], engine, accepted_per_step


GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("pool", sorted(POOLS))  # tight: preempted requests recompute (the MoE family: test_moe.py)
def test_prompt_lookup_in_the_batch_gives_the_same_greedy_tokens(byte_tok, pool):
    model = tiny_model("gqa_tied")
    got, engine, _ = speculative(model, byte_tok, GREEDY, pool)
    assert got == reference(model, byte_tok, GREEDY, pool)
    assert engine.spec_stats.proposed > 0
    if pool == "tight":
        assert engine.stats()["preemptions"] > 0


@pytest.mark.parametrize("backend", ["torch", "cpu"])  # cpu: each verification chunk's rows in the C kernel
def test_requests_accept_different_lengths_in_one_step(byte_tok, backend):
    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, "roomy")
    truth = {tuple(p): w for p, w in zip(PROMPTS, want)}
    got, engine, steps = speculative(model, byte_tok, GREEDY, "roomy", OracleDrafter(truth, wrong_every=3),
                                     backend=backend)
    assert got == want
    assert any(len({n for n in step.values() if n > 0}) > 1 for step in steps)  # different lengths, same step
    assert engine.spec_stats.accepted > 0 and engine.spec_stats.accepted < engine.spec_stats.proposed
    assert engine.mixed_steps > 0  # drafted decodes shared steps with prefill chunks


def test_a_stop_inside_an_accepted_run_ends_the_request_there(byte_tok):
    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, "roomy")
    stop_token = want[2][5]  # a token request 2 emits mid-answer
    params = SamplingParams(max_new_tokens=16, temperature=0.0, stop_token_ids=[stop_token], ignore_eos=True)
    truth = {tuple(p): w for p, w in zip(PROMPTS, want)}
    got, engine, _ = speculative(model, byte_tok, params, "roomy", OracleDrafter(truth, wrong_every=99), k=6)
    assert got == reference(model, byte_tok, params, "roomy")
    assert len(got[2]) < 16 and got[2][-1] == stop_token


def test_seeded_sampled_requests_reproduce_with_speculation(byte_tok):
    model = tiny_model("gqa_tied")
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=11)
    first, engine, _ = speculative(model, byte_tok, params, "roomy")
    second, _, _ = speculative(model, byte_tok, params, "roomy")
    assert first == second and engine.spec_stats.proposed > 0


def test_requests_with_logprobs_are_not_speculated(byte_tok):
    engine = Engine(tiny_model("gqa_tied"), byte_tok, KernelEngineConfig(num_blocks=64, block_size=4), [TINY_EOS],
                    SpeculativeConfig("lookup", 4))
    out = engine.generate([list(b"abcabcabcabc")], SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=2))
    assert engine.spec_stats.proposed == 0 and len(out[0].token_ids) == 8


GRAMMAR = r"\[[0-9]{1,3}(, [a-z]{1,4}){0,3}\]"


@pytest.mark.parametrize("wrong_every", [1, 2, 99])
def test_grammar_requests_never_verify_a_forbidden_draft(byte_tok, wrong_every):
    """Drafts corrupted into bytes the grammar forbids (every draft, every 2nd, almost none): each
    draft is cut at its first forbidden token before the step is scheduled, so no verified row
    ever holds one; outputs equal the unspeculated engine's and match the grammar."""
    import re

    from course.s08_structured.generate import GrammarLogitsProcessor
    from course.s08_structured.matcher import compile_grammar
    from course.s08_structured.frontends.regex_parser import regex_to_grammar
    from course.s08_structured.vocab import TokenizerInfo

    model = tiny_model("mha_untied")
    eos = byte_tok.eos_token_id
    compiled = compile_grammar(regex_to_grammar(GRAMMAR), TokenizerInfo.from_huggingface(byte_tok, stop_ids=[eos]))
    prompts = [list(b"list: "), list(b"Another prompt, longer than the first one: "), list(b"x")]

    def generate(engine):  # each request with its own grammar
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=24, temperature=0.0),
                                  grammar=GrammarLogitsProcessor(compiled)) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        return [engine.requests[i].seq.output_ids for i in ids]
    config = KernelEngineConfig(num_blocks=64, block_size=4)
    want = generate(Engine(model, byte_tok, config, [eos]))
    tilde = ord("~")  # never allowed by the grammar
    proposed = []

    class Corrupting(Drafter):
        def propose(self, seq, k):
            future = want[[tuple(p) for p in prompts].index(tuple(seq.prompt_ids))][len(seq.output_ids):][:k]
            proposed.append([tilde if (len(seq.output_ids) + i) % wrong_every == 0 else t
                             for i, t in enumerate(future)])
            return Draft(proposed[-1])

    class Watched(Engine):
        verified = []

        def _verify(self, req, rows, drafts):
            self.verified.append(list(drafts))
            return super()._verify(req, rows, drafts)
    engine = Watched(model, byte_tok, config, [eos], SpeculativeConfig("lookup", 4), drafter=Corrupting())
    got = generate(engine)
    assert got == want
    for ids in got:
        assert re.fullmatch(GRAMMAR, byte_tok.decode(ids, skip_special_tokens=True))
    assert any(tilde in d for d in proposed) == (wrong_every < 99)  # forbidden tokens were proposed (99: never)
    assert all(tilde not in d for d in engine.verified)  # none reached verification
    if wrong_every == 1:  # every draft starts with a forbidden token: nothing is left to verify
        assert engine.spec_stats.proposed == 0
    else:  # the valid prefixes were verified, and kept
        assert engine.spec_stats.proposed > 0 and engine.spec_stats.accepted > 0


def test_speculation_stops_when_the_batch_grows_past_the_limit(byte_tok):
    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, "roomy")
    truth = {tuple(p): w for p, w in zip(PROMPTS, want)}
    got, engine, steps = speculative(model, byte_tok, GREEDY, "roomy", OracleDrafter(truth, 3), disable_by_batch_size=2)
    assert got == want
    # with up to 4 running, steps with 3+ requests decoding emit one token each; speculation resumes at 2
    crowded = [s for s in steps if sum(n > 0 for n in s.values()) > 2]
    assert crowded and all(max(s.values()) == 1 for s in crowded)
    assert engine.spec_stats.proposed > 0


def test_speculative_config_is_checked():
    with pytest.raises(ValueError, match="unknown speculative method"):
        SpeculativeConfig("medusa")
    with pytest.raises(ValueError, match="at least 1"):
        SpeculativeConfig("lookup", 0)


def test_lookup_acceptance_counts_are_consistent(byte_tok):
    model = tiny_model("mha_untied")
    _, engine, _ = speculative(model, byte_tok, GREEDY, "roomy")
    s = engine.spec_stats
    assert s.emitted == s.accepted + s.target_forwards
    assert sum(engine.accepted_per_position) == s.accepted
    assert torch.tensor(engine.accepted_per_position).diff().le(0).all()  # position i+1 needs i accepted


def random_eagle(model, seed=0, draft_vocab=None, kind=EagleHead):
    torch.manual_seed(seed)
    head = kind(model.config, draft_vocab)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.05)
    return EagleSource(head.eval(), model)


@pytest.mark.parametrize("name, pool", [("gqa_tied", "roomy"), ("gqa_tied", "tight"),
                                        ("mha_untied", "tight")])  # untied: the head borrows a separate lm_head
def test_eagle_in_the_batch_gives_the_same_greedy_tokens(byte_tok, name, pool):
    """A random head drafts badly, but per-request features and head caches must stay right
    through chunked prefill, partial acceptance and preemption (recompute from position 0)."""
    model = tiny_model(name)
    source = random_eagle(model)
    got, engine, _ = speculative(model, byte_tok, GREEDY, pool, drafter=source)
    assert got == reference(model, byte_tok, GREEDY, pool)
    assert engine.spec_stats.proposed > 0
    assert not source.per_request  # every request's drafter state was dropped when it finished
    if pool == "tight":
        assert engine.stats()["preemptions"] > 0


@pytest.mark.parametrize("kernels", [{}, {"attention_backend": "cpu", "fused": True},
                                     {"attention_backend": "cpu", "fused": True, "cuda_graphs": True}])
def test_eagle3_in_the_batch_reads_the_tapped_layers_and_keeps_greedy_tokens(byte_tok, kernels):
    """An EAGLE-3 head reads three layers of the forward the engine runs: stage 01's model, the
    fused copy with the C one-call layers, and graph replays (the CPU's stand-in), where the
    taps come out of the captured step. Every position a request computed is observed as the
    fused taps (one fusion per step), and the greedy tokens stay the target's."""
    model = tiny_model("mqa_odd_heads")  # 3 layers: taps 0, 1 and 2
    source = random_eagle(model, kind=Eagle3Head)
    seen, observed = [], []
    observe, features_of = source.observe, source.features_of
    source.observe = lambda req, rows, start: (observed.append(rows.shape[-1]), observe(req, rows, start))
    source.features_of = lambda hidden: (seen.append(source.tapped_model.tapped.shape[-1]), features_of(hidden))[1]
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12, **kernels)
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("eagle", 3), drafter=source)
    got = [o.token_ids for o in engine.generate([list(p) for p in PROMPTS], GREEDY)]
    assert got == reference(model, byte_tok, GREEDY, "roomy")
    assert engine.spec_stats.proposed > 0 and set(seen) == {3 * model.config.hidden_size}
    assert set(observed) == {model.config.hidden_size}
    assert engine.runner.model.tap_layers == (0, 1, 2)
    if kernels.get("cuda_graphs"):
        assert engine.graphed_steps > 0


def test_eagle_sampled_requests_reproduce_and_use_the_draft_distribution(byte_tok):
    model = tiny_model("gqa_tied")
    params = SamplingParams(max_new_tokens=12, temperature=0.7, seed=5)
    first, engine, _ = speculative(model, byte_tok, params, "roomy", drafter=random_eagle(model))
    second, _, _ = speculative(model, byte_tok, params, "roomy", drafter=random_eagle(model))
    assert first == second and engine.spec_stats.proposed > 0


def test_eagle_with_a_draft_vocabulary_keeps_greedy_tokens_and_reproduces_samples(byte_tok):
    """A reduced draft vocabulary (stage 05) drafts only its own tokens; verification still
    emits the target's, and seeded sampling (drafts with zero mass outside) reproduces."""
    model = tiny_model("gqa_tied")
    vocab = torch.arange(0, 256, 3)  # a third of the byte tokens: many target tokens can't be drafted
    source = random_eagle(model, draft_vocab=vocab)
    got, engine, _ = speculative(model, byte_tok, GREEDY, "tight", drafter=source)
    assert got == reference(model, byte_tok, GREEDY, "tight")
    assert engine.spec_stats.proposed > 0
    params = SamplingParams(max_new_tokens=12, temperature=0.7, seed=5)
    first, engine, _ = speculative(model, byte_tok, params, "roomy", drafter=random_eagle(model, draft_vocab=vocab))
    second, _, _ = speculative(model, byte_tok, params, "roomy", drafter=random_eagle(model, draft_vocab=vocab))
    assert first == second and engine.spec_stats.proposed > 0


def test_draft_vocabulary_logits_take_the_engines_c_product_and_equal_torchs(byte_tok):
    """Where the engine runs the lm_head through stage 06's C product, so do the head's draft
    rows (one thread in torch's `linear`, all cores in the C), in int8 as the head's linears
    are: logits within int8's error of torch's float32 ones, and the target's greedy tokens."""
    from course.s06_kernels_graphs.cpu.layer import layer_kernel_unavailable
    if layer_kernel_unavailable():
        pytest.skip(f"the C layer kernel does not build here: {layer_kernel_unavailable()}")
    model = tiny_model("gqa_tied")
    source = random_eagle(model, draft_vocab=torch.arange(0, 256, 3))
    config = KernelEngineConfig(num_blocks=POOLS["tight"], block_size=4, max_num_seqs=4, max_num_batched_tokens=12,
                                attention_backend="cpu", fused=True, linear_splits=2)  # the server's CPU defaults
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("eagle", 3), drafter=source)
    assert [o.token_ids for o in engine.generate([list(p) for p in PROMPTS], GREEDY)] == \
        reference(model, byte_tok, GREEDY, "tight")
    head = source.head
    assert engine.spec_stats.proposed > 0 and head.vocab_product is not EagleHead.vocab_product
    x, rows = torch.randn(3, model.config.hidden_size), head._draft_rows[1]
    want = torch.nn.functional.linear(x, rows)
    assert (head.vocab_product(x, rows) - want).abs().max() <= 0.03 * want.abs().max()  # int8's error: small
    assert type(head.fc).__name__ == "Int8Linear"  # the engine's draft linears (stage 06's cpu room)


def test_a_head_for_another_model_is_refused_clearly():
    with pytest.raises(ValueError, match="cannot load the EAGLE head") as refused:
        make_source("eagle", tiny_model("gqa_tied"))  # the committed head is SmolLM2-135M's
    message = str(refused.value)
    assert "hidden size" in message and "fc.weight is (576, 1152), this model needs (64, 128)" in message
    assert "train_eagle" in message  # and how to make the right head


def test_a_missing_head_says_how_to_train_one(tmp_path):
    with pytest.raises(ValueError, match="no such file.*train_eagle"):
        make_source("eagle", tiny_model("gqa_tied"), tmp_path / "head.safetensors")


def test_more_drafts_than_a_step_holds_are_refused(byte_tok):
    model = tiny_model("gqa_tied")
    with pytest.raises(ValueError, match="leaves no room in a step of 8 tokens"):
        Engine(model, byte_tok, KernelEngineConfig(num_blocks=16, block_size=4, max_num_batched_tokens=8),
               speculative=SpeculativeConfig("lookup", num_speculative_tokens=8))


@pytest.mark.slow
@pytest.mark.parametrize("method, kernels", [("eagle", {}), ("lookup", {}),
                                             ("eagle", {"attention_backend": "cpu", "fused": True, "linear_splits": 2})])
def test_real_model_speculation_in_the_batch_keeps_every_greedy_token(smollm2, method, kernels):
    """Also with the server's CPU defaults, where EAGLE drafts through the engine's lm_head and int8 linears."""
    from course.s01_decode_loop.generate import encode_prompt
    prompts = [encode_prompt(smollm2.tokenizer, p, chat=True) for p in
               ["What is the capital of France?", "Repeat exactly: one two three four five six seven.",
                "Write a haiku about the sea.", "List three primary colors."]]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    want = BatchingEngine(smollm2.model, smollm2.tokenizer, EngineConfig(num_blocks=128), smollm2.eos_token_ids)
    engine = Engine(smollm2.model, smollm2.tokenizer, KernelEngineConfig(num_blocks=128, **kernels),
                    smollm2.eos_token_ids, SpeculativeConfig(method, 4))
    assert [o.token_ids for o in engine.generate(prompts, params)] == \
        [o.token_ids for o in want.generate(prompts, params)]
    assert engine.spec_stats.accepted > 0  # the real head (or lookup) does get drafts accepted
    if kernels:  # EAGLE drafts with the engine's lm_head and int8 linears; the model passed in is untouched
        from course.s06_kernels_graphs.cpu.int8_linear import Int8Linear
        assert engine.source.target.engine_model is engine.runner.model
        assert isinstance(engine.source.head.fc, Int8Linear) and type(smollm2.model.lm_head) is torch.nn.Linear


def test_rejection_sampling_in_the_batch_keeps_the_target_distribution(byte_tok):
    """Many seeded requests at once, each drafting the same token for its second position (a
    point mass): the second tokens must be distributed as without speculation, the draft kept
    as often as the target picks it. A verifier that kept every draft, or none, fails."""
    model = tiny_model("gqa_tied")
    prompt, n = list(b"to be or not to"), 400
    config = KernelEngineConfig(num_blocks=8 * n, block_size=4, max_num_seqs=64, max_num_batched_tokens=512)

    def second_tokens(engine, first_seed):
        params = [SamplingParams(max_new_tokens=3, temperature=0.9, seed=first_seed + s, ignore_eos=True)
                  for s in range(n)]
        return torch.tensor([o.token_ids[1] for o in engine.generate([prompt] * n, params)])

    plain = second_tokens(Engine(model, byte_tok, config, [TINY_EOS]), first_seed=10_000)
    p = torch.bincount(plain, minlength=258).float() / n
    mode = int(p.argmax())  # the draft: the target's likeliest second token (p ~ 0.37 here)
    assert 0.15 < p[mode] < 0.85  # a draft that is sometimes right, sometimes wrong

    class Fixed(Drafter):
        def propose(self, seq, k):
            return Draft([mode][:k])
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 1), drafter=Fixed())
    q = torch.bincount(second_tokens(engine, first_seed=0), minlength=258).float() / n
    stats = engine.spec_stats
    assert stats.proposed == n
    assert abs(q[mode] - p[mode]) < 0.1  # ~3 standard deviations of the difference of two samples
    assert abs(stats.accepted / n - p[mode]) < 0.1  # accepted exactly when the target would pick it
    rest_p, rest_q = p.clone(), q.clone()
    rest_p[mode] = rest_q[mode] = 0  # the rejected draws come from the residual: the rest of p
    assert 0.5 * (rest_p - rest_q).abs().topk(5).values.sum() < 0.1


def test_draft_free_requests_share_one_batched_sampling_call_per_step(byte_tok, monkeypatch):
    """Chunks without drafts (prefills, requests asking for logprobs) are sampled together, in
    one stage 04 `sample_batch` call per step, beside the drafted chunks' verification."""
    import course.s04_continuous_batching.engine as batching
    calls, real = [], batching.sample_batch
    monkeypatch.setattr(batching, "sample_batch", lambda logits, seqs, *rest: (calls.append(len(seqs)), real(logits, seqs, *rest))[1])
    model = tiny_model("gqa_tied")
    params = [GREEDY if i % 2 else SamplingParams(max_new_tokens=16, temperature=0, ignore_eos=True, logprobs=1)
              for i in range(len(PROMPTS))]
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12)
    engine = Engine(model, byte_tok, config, [TINY_EOS], SpeculativeConfig("lookup", 4))
    ids = [engine.add_request(list(p), sp) for p, sp in zip(PROMPTS, params)]
    shared_with_drafts = 0
    while engine.has_unfinished():
        before = len(calls)
        engine.step()
        assert len(calls) - before <= 1
        shared_with_drafts += bool(any(engine.drafts.values()) and calls[before:] and calls[-1] >= 2)
    assert shared_with_drafts  # several draft-free rows in one call, in steps that also verified drafts
    assert [engine.requests[r].seq.output_ids for r in ids] == reference(model, byte_tok, params, "roomy")


def tree_engine(model, tok, config, source, k=3):
    """An engine drafting EAGLE-2 trees k deep (cli.py's --speculative-tree) from `source`."""
    engine = Engine(model, tok, config, [TINY_EOS], SpeculativeConfig("eagle", k), drafter=source)
    engine.trees = TreeDrafting(engine)
    return engine


class TreeOracle(DraftSource):
    """Trees whose right answer hides on a later branch at every level: each level offers a
    wrong token first and the request's true next token second (then a wrong sibling of it), so
    accepted nodes sit at scattered rows and their K/V must be moved to the right slots."""

    def __init__(self, truth: dict[tuple, list[int]]):
        super().__init__(None)
        self.truth, self.trees = truth, 0
        self.calibration = Calibration()  # a tree source's: its trees carry no chances, so it stays empty

    def features_of(self, hidden):
        return hidden

    def propose(self, req, k):
        return Draft([])

    def propose_tree(self, req, depth, max_nodes, cost=None):
        future = self.truth[tuple(req.seq.prompt_ids)][len(req.seq.output_ids):][:depth]
        tree, parent = Tree(), -1
        for token in future:
            if len(tree) + 2 > max_nodes:
                break
            tree.add((token + 1) % 256, parent)
            parent = tree.add(token, parent)
        self.trees += len(tree) > 0
        return tree


@pytest.mark.parametrize("kernels", [{"attention_backend": "torch"},
                                     {"attention_backend": "cpu", "fused": True},
                                     {"attention_backend": "cpu", "fused": True, "one_call_layers": False}])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_trees_in_the_batch_keep_every_greedy_token(byte_tok, pool, kernels):
    """Trees verified inside the batch (torch, the C kernel, the C one-call layers): accepted
    branches at scattered rows, their K/V moved into place, beside prefill chunks and through
    preemption, give the tokens a run without speculation gives; and a random EAGLE head's
    own trees do too."""
    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, pool)
    oracle = TreeOracle({tuple(p): w for p, w in zip(PROMPTS, want)})
    config = KernelEngineConfig(num_blocks=POOLS[pool], block_size=4, max_num_seqs=4, max_num_batched_tokens=12,
                                **kernels)
    for source in (oracle, random_eagle(model)):
        engine = tree_engine(model, byte_tok, config, source)
        got = [o.token_ids for o in engine.generate([list(p) for p in PROMPTS], GREEDY)]
        assert got == want
        assert engine.spec_stats.proposed > 0
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
        if source is not oracle:  # every verified tree calibrates the head's chances, for all requests
            assert sum(source.calibration.predicted.values()) > 0
    assert oracle.trees > 0
    if pool == "tight":
        assert engine.stats()["preemptions"] > 0


def test_accepted_tree_nodes_move_next_to_the_root():
    from course.final.speculation.trees import move_accepted_kv
    from course.s03_paged.paged_attention import PagedKVCache

    cache = PagedKVCache(tiny_model("gqa_tied").config, 8, 4)
    cache.k.copy_(torch.arange(cache.k.numel(), dtype=torch.float32).view_as(cache.k))
    cache.v.copy_(-cache.k)
    before_k, table = cache.k.clone(), [5, 2, 7]
    slot = lambda p: (table[p // 4], p % 4)  # noqa: E731
    move_accepted_kv(cache, table, start=3, path=[1, 4])  # nodes 1 and 4: slots 5 and 8 -> 4 and 5
    for src, dst in [(5, 4), (8, 5)]:
        assert torch.equal(cache.k[:, slot(dst)[0], slot(dst)[1]], before_k[:, slot(src)[0], slot(src)[1]])
        assert torch.equal(cache.v[:, slot(dst)[0], slot(dst)[1]], -before_k[:, slot(src)[0], slot(src)[1]])
    assert torch.equal(cache.k[:, slot(3)[0], slot(3)[1]], before_k[:, slot(3)[0], slot(3)[1]])  # the root stays


def test_trees_need_an_eagle_drafter_and_a_backend_that_masks_them(byte_tok):
    model = tiny_model("gqa_tied")
    config = KernelEngineConfig(num_blocks=16, block_size=4, max_num_batched_tokens=12, attention_backend="torch")
    with pytest.raises(ValueError, match="drafted by an EAGLE head"):
        TreeDrafting(Engine(model, byte_tok, config, speculative=SpeculativeConfig("lookup", 3)))
    with pytest.raises(ValueError, match="1 to 63 nodes"):
        TreeDrafting(Engine(model, byte_tok, config, speculative=SpeculativeConfig("eagle", 3),
                            drafter=random_eagle(model)), max_nodes=64)


@pytest.mark.parametrize("kernels", [{"attention_backend": "torch"},
                                     {"attention_backend": "cpu", "fused": True},
                                     {"attention_backend": "cpu", "fused": True, "one_call_layers": False}])
def test_after_every_tree_step_the_cache_holds_the_emitted_tokens_kv(byte_tok, kernels):
    """The strict check behind the tokens: after each step the request's K/V, position by
    position, is what a plain prefill of its tokens computes, so the tree's rows were placed at
    their depths, attended along their own paths, and the accepted ones moved into place."""
    from course.s02_kv_cache.generate import step_metadata
    from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache

    model = tiny_model("gqa_tied")
    want = reference(model, byte_tok, GREEDY, "roomy")
    oracle = TreeOracle({tuple(p): w for p, w in zip(PROMPTS, want)})
    config = KernelEngineConfig(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=12, **kernels)
    engine = tree_engine(model, byte_tok, config, oracle)
    rid = engine.add_request(list(PROMPTS[2]), GREEDY)
    checked = 0
    while engine.has_unfinished():
        engine.step()
        req = engine.requests[rid]
        if req.finished:
            break
        n, table = req.num_computed_tokens, engine.blocks.tables[rid]
        slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in range(n)])
        got = engine.cache.k.flatten(1, 2)[:, slots]  # [layers, n, kv heads, d]
        cache = KVCache(model.config, n)
        with torch.no_grad():
            model(torch.tensor(req.all_ids[:n]), ContiguousKVAttention(cache), step_metadata(0, n, "cpu"))
        torch.testing.assert_close(got, cache.k[:, :n], atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked > 3 and oracle.trees > 3 and engine.spec_stats.accepted > 0
