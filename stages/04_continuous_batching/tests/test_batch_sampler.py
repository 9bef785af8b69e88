"""The batched sampler gives every request exactly what stage 01's per-row sampler gives it."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.s01_decode_loop.sampling import SamplingParams, process_logits
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import tiny_model
from course.s04_continuous_batching import batch_sampler
from course.s04_continuous_batching.batch_sampler import sample_batch
from course.s04_continuous_batching.engine import EngineConfig, LLMEngine, StepOutput


def every_third(output_ids, logits):
    """A grammar-like mask that changes with the output: only ids = len(output) mod 3 allowed."""
    mask = torch.full_like(logits, float("-inf"))
    mask[len(output_ids) % 3::3] = 0
    return logits + mask


def ban_in_place(output_ids, logits):
    """A processor that writes into the logits it is given (logprobs then see the ban, as in stage 01)."""
    logits[:7] = float("-inf")
    return logits


def mixed_params(vocab: int, n: int) -> list[SamplingParams]:
    """One of every kind of row a batch can hold."""
    p = lambda **kw: SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)  # noqa: E731
    return [
        p(temperature=0),
        p(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5, logprobs=5),
        p(temperature=0.7, seed=1),
        p(temperature=1.0, top_k=20, seed=2),
        p(top_k=vocab, seed=3),  # top-k as wide as the vocabulary: disabled
        p(temperature=1.3, top_p=0.9, seed=4),
        p(min_p=0.1, seed=5),
        p(temperature=0.8, top_k=50, top_p=0.95, min_p=0.05, repetition_penalty=1.2, presence_penalty=0.3,
          frequency_penalty=0.2, seed=6, logprobs=3),
        p(top_p=0.8, seed=7, logits_processors=[every_third]),
        p(temperature=0, logits_processors=[every_third], logprobs=2),
        p(temperature=0.9, seed=8, logits_processors=[ban_in_place], logprobs=4),
        p(logprobs=0, seed=9),
        p(temperature=0.6, top_k=5, seed=None),  # unseeded: the reference copies its drawn seed
    ]


def random_logits(g: torch.Generator, rows: int, vocab: int, dtype=torch.float32) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=g) * 3
    masked = torch.rand(rows, vocab, generator=g) < 0.3
    masked[torch.rand(rows, generator=g) < 0.5] = False  # about half the rows have -inf entries
    logits[masked] = float("-inf")
    ties = torch.rand(rows, generator=g) < 0.3
    logits[ties] = torch.round(logits[ties])  # many equal logits: argmax and top-k tie rules matter
    return logits.to(dtype)


def twins(params: list[SamplingParams], tok) -> tuple[list[Sequence], list[Sequence]]:
    """The same requests twice: one sampled row by row (stage 01), one through sample_batch."""
    ref = [Sequence([1, 2, 3, 2], sp, tok) for sp in params]
    new = [Sequence([1, 2, 3, 2], sp, tok) for sp in params]
    for a, b in zip(ref, new):
        b.sampler.seed = a.sampler.seed  # (equal already, unless unseeded)
    return ref, new


def step_both(ref, new, logits, members, shared=None) -> None:
    """Sample `members` (indices into ref/new, in batch order) both ways from the same logits."""
    expected = [ref[m].sample_and_append(row) for m, row in zip(members, logits.clone())]
    got = sample_batch(logits, [new[m] for m in members], shared)
    for m, event, sample in zip(members, expected, got):
        assert not isinstance(sample, Exception), sample
        assert sample.token_id == event.token_id, (m, new[m].params)
        assert (sample.logprob, sample.top_logprobs) == (event.logprob, event.top_logprobs), m
        new[m].append(sample.token_id)


def assert_same_generators(ref, new) -> None:
    for a, b in zip(ref, new):
        assert (a.sampler._generator is None) == (b.sampler._generator is None)
        if a.sampler._generator is not None:  # consumed identically
            assert torch.equal(a.sampler._generator.get_state(), b.sampler._generator.get_state())
    assert [a.output_ids for a in ref] == [b.output_ids for b in new]


@pytest.mark.parametrize("vocab,steps,dtype", [(1000, 40, torch.float32), (1000, 15, torch.bfloat16),
                                               (49152, 3, torch.float32)])
def test_batch_sampler_equals_stage01_row_by_row_on_a_mixed_batch(byte_tok, vocab, steps, dtype):
    """Greedy, seeded temperature, top-k, top-p, min-p, penalties, processors, logprobs, -inf
    entries and ties; each step a different subset of the requests, in a different order."""
    params = mixed_params(vocab, steps)
    ref, new = twins(params, byte_tok)
    g = torch.Generator().manual_seed(vocab + steps)
    for step in range(steps):
        members = torch.randperm(len(params), generator=g)[:int(torch.randint(1, len(params) + 1, (), generator=g))]
        members = members.tolist() if step else list(range(len(params)))  # step 0: everyone
        step_both(ref, new, random_logits(g, len(members), vocab, dtype), members)
    assert_same_generators(ref, new)


@pytest.mark.parametrize("vocab", [1000, 49152])
def test_batch_sampler_filters_are_bit_for_bit_stage01(vocab):
    """Tokens only differ on a near-tie, so compare what decides them: every row's processed
    logits equal stage 01's process_logits of that row alone, to the last bit."""
    g = torch.Generator().manual_seed(vocab)
    params = [SamplingParams(temperature=float(t), top_k=int(k), top_p=float(p), min_p=float(m))
              for t, k, p, m in zip(torch.tensor([0, 0.3, 0.7, 1, 1.3, 2]).repeat(4),
                                    torch.tensor([0, 1, 7, 50, vocab - 1, vocab]).repeat_interleave(4),
                                    torch.tensor([1, 0.1, 0.5, 0.9, 0.95, 0.999]).repeat(4).roll(5),
                                    torch.tensor([0, 0.01, 0.1, 0.5, 0.9, 1]).repeat(4).roll(11))]
    for _ in range(3 if vocab < 5000 else 1):
        logits = random_logits(g, len(params), vocab)
        got = batch_sampler.filter_rows(logits.clone(), params)
        for row, p, out in zip(logits, params, got):
            assert torch.equal(out, process_logits(row, p, [], [])), p


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    "top_k": st.sampled_from([0, -1, 1, 3, 64, 300]),
    "top_p": st.sampled_from([1.0, 0.9, 0.5, 0.01]),
    "min_p": st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    "repetition_penalty": st.sampled_from([1.0, 0.8, 1.5]),
    "frequency_penalty": st.sampled_from([0.0, -1.0, 1.0]),
    "logprobs": st.sampled_from([None, 0, 1, 5]),
    "seed": st.integers(0, 2**32)}), min_size=1, max_size=6), data_seed=st.integers(0, 2**16))
def test_batch_sampler_equals_stage01_for_any_parameters(byte_tok, rows, data_seed):
    params = [SamplingParams(max_new_tokens=4, ignore_eos=True, **kw) for kw in rows]
    ref, new = twins(params, byte_tok)
    g = torch.Generator().manual_seed(data_seed)
    for _ in range(4):
        step_both(ref, new, random_logits(g, len(params), 300), list(range(len(params))))
    assert_same_generators(ref, new)


def test_batch_sampler_a_failing_row_fails_alone(byte_tok):
    """A processor that raises, one that returns the wrong thing, logprobs past the vocabulary:
    those rows get their exception, every other row its stage 01 token."""
    def broken(output_ids, logits):
        raise RuntimeError("processor bug")
    bad = {4: (SamplingParams(seed=1, logits_processors=[broken]), "processor bug"),
           7: (SamplingParams(logits_processors=[lambda o, x: x[:5]]), "must return logits of shape (300,)"),
           9: (SamplingParams(temperature=0, logprobs=301), "logprobs=301")}
    params = mixed_params(300, 5)
    for position, (sp, _) in sorted(bad.items()):
        params.insert(position, sp)
    ref, new = twins(params, byte_tok)
    logits = random_logits(torch.Generator().manual_seed(0), len(params), 300)
    got = sample_batch(logits, new)
    for m, sample in enumerate(got):
        if m in bad:
            assert isinstance(sample, Exception) and bad[m][1] in str(sample)
        else:
            assert sample.token_id == ref[m].sample_and_append(logits[m].clone()).token_id
            new[m].append(sample.token_id)
    fine = [m for m in range(len(params)) if m not in bad]
    assert_same_generators([ref[m] for m in fine], [new[m] for m in fine])


def test_batch_sampler_syncs_with_the_host_once_per_step(byte_tok, monkeypatch):
    """One .tolist() for the whole step (tokens and logprobs): no int()/item()/float() per row."""
    calls = []

    def counted(name):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            calls.append(name)
            return original(self, *args, **kwargs)
        return method
    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    params = [p for p in mixed_params(1000, 4) if not p.logits_processors]  # processors are the user's code
    seqs = [Sequence([1, 2], sp, byte_tok) for sp in params]
    sample_batch(torch.randn(len(seqs), 1000), seqs)
    assert calls == ["tolist"]


def test_batch_sampler_skips_disabled_filters(byte_tok, monkeypatch):
    """A filter runs only on the rows that enable it, never on the whole batch 'as a no-op'."""
    calls = []
    for name in ("_top_k", "apply_top_p", "apply_min_p"):
        original = getattr(batch_sampler, name)
        monkeypatch.setattr(batch_sampler, name,
                            lambda x, v, _o=original, _n=name: (calls.append((_n, x.shape[0])), _o(x, v))[1])
    params = [SamplingParams(top_p=0.9, top_k=100), SamplingParams(), SamplingParams(temperature=0, top_p=0.5),
              SamplingParams(top_p=0.5, min_p=0.2, top_k=3)]
    sample_batch(torch.randn(4, 100), [Sequence([1], sp, byte_tok) for sp in params])
    # top_k=100 is the whole vocabulary; the greedy row skips the chain
    assert calls == [("_top_k", 1), ("apply_top_p", 2), ("apply_min_p", 1)]
    calls.clear()
    sample_batch(torch.randn(2, 100), [Sequence([1], SamplingParams(), byte_tok) for _ in range(2)])
    assert calls == []


class RowByRowEngine(LLMEngine):
    """Stage 04's postprocess before the batched sampler: one sample_and_append per request."""

    def _postprocess(self, chunks, logits):
        outputs, i = [], 0
        for req, n in chunks:
            req.num_computed_tokens += n
            self.blocks.commit(req.request_id, req.all_ids[:req.num_computed_tokens])
            if req.num_computed_tokens < req.num_tokens:
                continue
            row, i = logits[i], i + 1
            try:
                event = req.seq.sample_and_append(row)
            except Exception as e:
                req.finish_reason, req.error = "error", e
                self.scheduler.finish(req)
                outputs.append(StepOutput(req.request_id, None, e))
                continue
            outputs.append(StepOutput(req.request_id, event))
            if event.finish_reason:
                req.finish_reason = event.finish_reason
                self.scheduler.finish(req)
        return outputs


def test_batch_sampler_engine_gives_what_row_by_row_sampling_gave(byte_tok):
    """The same crowd through stage 04's engine with the batched sampler and with per-row
    sampling: the same schedule, so the same logits, so exactly the same events (a failing
    request included)."""
    def broken_late(output_ids, logits):
        if len(output_ids) == 5:
            raise RuntimeError("processor bug")
        return logits
    model = tiny_model("gqa_tied")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 40, 17, 1, 25, 9)]
    params = mixed_params(258, 8)[1:] + [SamplingParams(max_new_tokens=8, seed=4, logits_processors=[broken_late])]
    runs = []
    for engine_cls in (RowByRowEngine, LLMEngine):
        engine = engine_cls(model, byte_tok, EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=24))
        ids = [engine.add_request(prompts[i % len(prompts)], sp) for i, sp in enumerate(params)]
        engine.unseeded_generator.manual_seed(7)
        for r, seq in zip(ids, (engine.requests[r].seq for r in ids)):
            seq.sampler.seed = 1000 + r
            if seq.params.seed is None:  # row by row, the unseeded draw in turn from the engine's generator
                seq.sampler._generator = engine.unseeded_generator
        events = []
        while engine.has_unfinished():
            events += [(o.request_id, o.event and (o.event.token_id, o.event.text, o.event.finish_reason,
                                                   o.event.logprob, o.event.top_logprobs), str(o.error))
                       for o in engine.step()]
        runs.append((sorted(events, key=lambda e: e[0]), [engine.requests[r].finish_reason for r in ids]))
    assert runs[0] == runs[1]
    assert runs[1][1][-1] == "error" and runs[1][1].count("error") == 1


# ---- the shared generator: every unseeded row's noise in one call -------------------------------

def unseeded_crowd(vocab: int, n: int) -> list[SamplingParams]:
    """mixed_params (greedy and seeded rows) with unseeded rows between them."""
    p = lambda **kw: SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)  # noqa: E731
    extra = [p(), p(temperature=0.5, top_p=0.9), p(top_k=7, logprobs=2), p(min_p=0.2, repetition_penalty=1.2),
             p(temperature=1.4, logits_processors=[every_third])]
    out = []
    for i, sp in enumerate(mixed_params(vocab, n)):
        out += [sp] + ([extra[i // 3]] if i % 3 == 0 and i // 3 < len(extra) else [])
    return out


def inverse_cdf_reference(seq: Sequence, generator: torch.Generator) -> None:
    """Make `seq` sample as the batch's unseeded rows should, one row at a time: stage 01's
    process_logits and softmax, then one float64 uniform u from `generator`, and the token is
    how many cumulative probabilities are <= u x their total."""
    def sample(logits, prompt_ids, output_ids):
        probs = torch.softmax(process_logits(logits.float(), seq.params, prompt_ids, output_ids), dim=-1)
        cdf = probs.to(torch.float64).cumsum(dim=-1)
        u = torch.rand((1, 1), dtype=torch.float64, generator=generator).item()
        return int((cdf <= u * cdf[-1]).sum())
    seq.sampler.sample = sample


@pytest.mark.parametrize("vocab,steps", [(1000, 20), (49152, 2)])
def test_batch_sampler_shared_draw_keeps_greedy_and_seeded_rows_exact(byte_tok, vocab, steps):
    """With the engine's shared generator: greedy and seeded rows get stage 01's tokens and their
    own generators are consumed identically; the unseeded rows get the inverse-CDF token of one
    uniform each, drawn in row order from one generator (the one-call draw equals the row-by-row
    draws on the CPU), and never make generators of their own."""
    params = unseeded_crowd(vocab, steps)
    assert sum(p.seed is None and not p.greedy for p in params) == 6
    ref, new = twins(params, byte_tok)
    ref_shared, shared = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for seq, sp in zip(ref, params):
        if sp.seed is None and not sp.greedy:
            inverse_cdf_reference(seq, ref_shared)
    g = torch.Generator().manual_seed(vocab)
    for step in range(steps):
        members = torch.randperm(len(params), generator=g)[:int(torch.randint(1, len(params) + 1, (), generator=g))]
        members = members.tolist() if step else list(range(len(params)))
        step_both(ref, new, random_logits(g, len(members), vocab), members, shared)
    seeded = [m for m, sp in enumerate(params) if sp.seed is not None]
    assert_same_generators([ref[m] for m in seeded], [new[m] for m in seeded])
    assert [a.output_ids for a in ref] == [b.output_ids for b in new]
    assert torch.equal(ref_shared.get_state(), shared.get_state())
    assert all(new[m].sampler._generator is None for m, sp in enumerate(params) if sp.seed is None)


def test_batch_sampler_draws_unseeded_noise_in_one_call(byte_tok, monkeypatch):
    """One exponential_ per seeded row, one uniform per unseeded row (all in one call), none for greedy rows."""
    calls, uniforms = [], []
    original, rand = torch.Tensor.exponential_, torch.rand
    monkeypatch.setattr(torch.Tensor, "exponential_",
                        lambda self, *a, **kw: (calls.append(self.shape[0] if self.dim() == 2 else 1),
                                                original(self, *a, **kw))[1])
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: (uniforms.append(tuple(a[0])), rand(*a, **kw))[1])
    params = [SamplingParams(), SamplingParams(seed=3), SamplingParams(temperature=0), SamplingParams(top_p=0.8),
              SamplingParams(seed=4, top_k=5), SamplingParams(temperature=0.3), SamplingParams(temperature=0)]
    seqs = [Sequence([1], sp, byte_tok) for sp in params]
    sample_batch(torch.randn(len(seqs), 100), seqs, torch.Generator().manual_seed(0))
    assert sorted(calls) == [1, 1] and uniforms == [(3, 1)]  # two seeded rows; the three unseeded ones in one call
    calls.clear()
    sample_batch(torch.randn(len(seqs), 100), seqs)  # no shared generator: stage 01's per-row draws
    assert calls == [1] * 5


def test_batch_sampler_shared_draw_samples_the_right_distribution(byte_tok):
    """Many unseeded rows over one fixed distribution (temperature and top-k applied), drawn
    through the shared generator: a chi-square test of the token counts against the expected
    probabilities (7 degrees of freedom; 24.32 is the 0.1% critical value), with a fixed seed."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0])
    params = SamplingParams(temperature=0.8, top_k=8)
    expected = torch.softmax(process_logits(logits, params, [], []), dim=-1)
    seqs = [Sequence([1], params, byte_tok) for _ in range(64)]
    shared, counts = torch.Generator().manual_seed(0), torch.zeros(10)
    for _ in range(150):
        for sample in sample_batch(logits.expand(len(seqs), -1).clone(), seqs, shared):
            counts[sample.token_id] += 1
    assert counts[8:].sum() == 0  # outside top-k: never
    n = counts.sum()
    chi2 = float((((counts[:8] - n * expected[:8]) ** 2) / (n * expected[:8])).sum())
    assert chi2 < 24.32, (chi2, counts / n, expected)
