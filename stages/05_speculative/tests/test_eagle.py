"""EAGLE chain and tree drafting keep the target's greedy output; tree verification agrees
with chain verification along every path."""
import copy
import math

import pytest
import torch

from course.s01_decode_loop.sampling import SamplingParams
from course.s01_decode_loop.sequence import Sequence
from course.s01_decode_loop.testing import TINY_CONFIGS, tiny_model
from course.s02_kv_cache.generate import forward_step, generate_cached
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache
from course.s05_speculative.eagle import EagleDrafter, EagleHead, HeadMismatch
from course.s05_speculative.eagle3 import Eagle3Head
from course.s05_speculative.speculative import SpecStats, forward_hidden, stream_speculative, stream_tree_speculative
from course.s05_speculative.tree import (Calibration, Tree, TreeAttention, VerifyCost, accept_greedy_path,
                                         block_metadata, compact, deeper_may_pay, tree_size)
from course.s05_speculative.verify import verify_greedy

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]
GREEDY = SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True)


def eagle(model, seed=0, kind="eagle"):
    torch.manual_seed(seed)  # an untrained head: poor drafts, which must not change the output
    head = Eagle3Head(model.config) if kind == "eagle3" else EagleHead(model.config)
    return EagleDrafter(head.eval(), model)


def ready_to_draft(model, tok, calibration=None):
    """An untrained EAGLE drafter that has seen PROMPT's features, and the sequence one token past
    it: where a tree is drafted from."""
    drafter = eagle(model)
    if calibration is not None:
        drafter.calibration = calibration
    seq = Sequence(PROMPT, GREEDY, tok)
    drafter.begin(seq)
    drafter.observe(forward_hidden(model, ContiguousKVAttention(KVCache(model.config, 64)), PROMPT), start=0)
    seq.append(5)
    return drafter, seq


def run(stream, model, tok, drafter, params=GREEDY, **kw):
    seq, stats = Sequence(PROMPT, params, tok), SpecStats()
    list(stream(model, seq, drafter, stats=stats, **kw))
    return seq.output().token_ids, stats


# each shape on one architecture, every architecture at one shape: the two vary independently;
# both heads (EAGLE-1/2 and EAGLE-3) on every architecture
CHAIN_CASES = ([("mha_untied", 1, "eagle"), ("mha_untied", 5, "eagle"), ("mha_untied", 5, "eagle3")]
               + [(name, 3, kind) for name in sorted(TINY_CONFIGS) for kind in ("eagle", "eagle3")])
TREE_CASES = ([("mha_untied", (1, 1, 1), "eagle"), ("mha_untied", (3, 2, 6), "eagle3")]
              + [(name, (5, 4, 16), kind) for name in sorted(TINY_CONFIGS) for kind in ("eagle", "eagle3")])


@pytest.mark.parametrize("config,k,kind", CHAIN_CASES)
def test_eagle_chain_greedy_equals_stage02(config, byte_tok, k, kind):
    model = tiny_model(config)
    ref = generate_cached(model, byte_tok, PROMPT, GREEDY).token_ids
    out, stats = run(stream_speculative, model, byte_tok, eagle(model, kind=kind), k=k)
    assert out == ref and stats.proposed > 0


@pytest.mark.parametrize("config,shape,kind", TREE_CASES)
def test_eagle_tree_greedy_equals_stage02(config, byte_tok, shape, kind):
    model, (depth, top_k, max_nodes) = tiny_model(config), shape
    ref = generate_cached(model, byte_tok, PROMPT, GREEDY).token_ids
    out, stats = run(stream_tree_speculative, model, byte_tok, eagle(model, kind=kind), depth=depth, top_k=top_k,
                     max_nodes=max_nodes)
    assert out == ref
    assert 0 < stats.proposed <= max_nodes * stats.target_forwards


def test_eagle_tree_refuses_sampling(byte_tok):
    model = tiny_model("mha_untied")
    with pytest.raises(ValueError, match="greedy"):
        run(stream_tree_speculative, model, byte_tok, eagle(model), params=SamplingParams(temperature=0.7))


def test_eagle_sampled_chain_is_seeded(byte_tok):
    model = tiny_model("mha_untied")
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in (4, 4, 5)]
    runs = [run(stream_speculative, model, byte_tok, eagle(model), params=p, k=3)[0] for p in params]
    assert runs[0] == runs[1] != runs[2]


def prefilled(model, ids):
    cache = KVCache(model.config, 128)
    forward_step(model, ContiguousKVAttention(cache), ids[:-1])
    return cache


def test_tree_verification_agrees_with_chain_verification_on_every_path(byte_tok):
    """A hand-made tree whose middle branch follows the target: the tree's accepted path is what
    chain verification accepts along it, and along every other root-to-leaf path chain
    verification accepts a prefix of it. Checks the tree mask, the positions, the compaction."""
    model = tiny_model("mha_untied")
    ref = generate_cached(model, byte_tok, PROMPT, GREEDY).token_ids
    ids = PROMPT + ref[:3]  # three tokens already emitted; the next are ref[3], ref[4], ...
    nxt = ref[3:]
    tree = Tree()
    a = tree.add((nxt[0] + 1) % 258, -1)
    b = tree.add(nxt[0], -1)                  # right
    tree.add((nxt[1] + 7) % 258, a)
    c = tree.add(nxt[1], b)                   # right
    tree.add((nxt[2] + 5) % 258, b)
    tree.add((nxt[2] + 1) % 258, c)           # wrong at depth 3
    cache = prefilled(model, ids)
    start = cache.num_tokens
    block = torch.tensor([ids[-1]] + tree.tokens)
    with torch.no_grad():
        hidden = model(block, TreeAttention(cache, start, tree.block_mask()),
                       block_metadata(start, [start] + [start + d for d in tree.depths], "cpu"))
    path, emitted = accept_greedy_path(tree, torch.argmax(model.compute_logits(hidden), -1).tolist())
    assert path == [b, c] and emitted == nxt[:3]

    leaves = [i for i in range(len(tree)) if i not in tree.parents]
    for leaf in leaves:
        draft = [tree.tokens[i] for i in tree.path_to(leaf)]
        chain_cache = prefilled(model, ids)
        logits = model.compute_logits(forward_hidden(model, ContiguousKVAttention(chain_cache), [ids[-1]] + draft))
        chain = verify_greedy(logits, draft)
        accepted = chain[:-1]
        assert accepted == emitted[:len(accepted)]  # a prefix of the tree's path
        if tree.path_to(leaf)[:len(path)] == path:
            assert chain == emitted  # along the accepted path: the same tokens, the same bonus

    compact(cache, start, path)  # the K/V of the accepted path, moved into place, equal a plain run
    plain = prefilled(model, ids + emitted[:-1] + [0])
    n = plain.num_tokens
    assert cache.num_tokens == n
    torch.testing.assert_close(cache.k[:, :n], plain.k[:, :n], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v[:, :n], plain.v[:, :n], atol=1e-5, rtol=1e-4)


def test_tree_block_mask_is_ancestry():
    tree = Tree()
    a = tree.add(5, -1)
    b = tree.add(6, -1)
    c = tree.add(7, a)
    mask = tree.block_mask()
    assert mask.tolist() == [[True, False, False, False],
                             [True, True, False, False],
                             [True, False, True, False],
                             [True, True, False, True]]
    assert tree.path_to(c) == [a, c] and tree.depths == [1, 1, 2] and b == 1


def test_eagle_head_round_trips_through_safetensors(tmp_path):
    model = tiny_model("mha_untied")
    head = eagle(model).head
    head.save(tmp_path / "h.safetensors", {"note": "test"})
    again = EagleHead.load(tmp_path / "h.safetensors", model)
    for (name, x), (_, y) in zip(head.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(x.to(torch.bfloat16).float(), y, msg=name)
    assert sum(p.numel() for p in head.parameters()) < sum(p.numel() for p in model.parameters())
    assert copy.deepcopy(again) is not None


@pytest.mark.parametrize("depth,top_k,max_nodes", [(1, 3, 2), (4, 2, 7), (5, 4, 16)])
def test_eagle_tree_drafts_a_well_formed_tree(byte_tok, depth, top_k, max_nodes):
    drafter, seq = ready_to_draft(tiny_model("mha_untied"), byte_tok)
    tree = drafter.propose_tree(seq, depth, top_k, max_nodes)
    assert 0 < len(tree) <= max_nodes and max(tree.depths) <= depth
    assert all(p < i for i, p in enumerate(tree.parents))  # parents come first
    for i in range(len(tree)):  # siblings hold distinct tokens, so a path is unambiguous
        sibs = [tree.tokens[j] for j in range(len(tree)) if tree.parents[j] == tree.parents[i]]
        assert len(sibs) == len(set(sibs))
    assert drafter.cache.num_tokens == len(PROMPT)  # the head keeps its true entries, drops the drafting ones


def test_eagle3_reads_the_outputs_of_its_three_layers(byte_tok):
    """The target's forward leaves the tapped layers' outputs side by side (checked against
    forward hooks on those layers), and the drafter keeps fuse(taps) as each position's feature."""
    model = tiny_model("mqa_odd_heads")  # 3 layers: taps 0, 1, 2 would be every one; ask for two
    head = Eagle3Head(model.config, tap_layers=(0, 2)).eval()
    drafter = EagleDrafter(head, model)
    seen = {}
    hooks = [model.model.layers[i].register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out))
             for i in (0, 2)]
    cache = KVCache(model.config, 32, model.dtype, model.device)
    try:
        hidden = forward_hidden(model, ContiguousKVAttention(cache), PROMPT)
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(model.model.tapped, torch.cat([seen[0], seen[2]], dim=-1))
    features = drafter.features_of(hidden)
    with torch.no_grad():
        torch.testing.assert_close(features, head.input_features(torch.cat([seen[0], seen[2]], dim=-1)))
    drafter.begin(Sequence(PROMPT, GREEDY, byte_tok))
    drafter.observe(features, start=0)
    torch.testing.assert_close(drafter.features[:len(PROMPT)], features)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_head_made_for_another_model_is_refused_naming_the_shapes(tmp_path, kind):
    made_for, served = tiny_model("mha_untied"), tiny_model("mqa_odd_heads")  # hidden 64 and 48
    eagle(made_for, kind=kind).head.save(tmp_path / "h.safetensors")
    with pytest.raises(HeadMismatch, match=r"fc.weight is \(64, 128\), this model needs \(48, 96\)"):
        EagleHead.load(tmp_path / "h.safetensors", served)


def test_an_eagle3_head_reading_layers_the_model_lacks_is_refused(tmp_path):
    model = tiny_model("mha_untied")  # 2 layers
    Eagle3Head(model.config, tap_layers=(0, 5)).save(tmp_path / "h.safetensors")
    with pytest.raises(HeadMismatch, match=r"reads layers \[0, 5\], this model has 2"):
        EagleHead.load(tmp_path / "h.safetensors", model)


def test_tree_size_keeps_the_nodes_that_pay_for_their_verify():
    """Expected tokens per second of the step, from each node's chance and a verify cost: a free verify keeps every node, a steep one none, and
    in between the sure nodes but not the long shots."""
    chances = [0.9, 0.8, 0.5, 0.05, 0.01]  # chances
    assert tree_size(chances, VerifyCost({1: 1.0, 17: 1.0}), max_nodes=16) == 5
    assert tree_size(chances, VerifyCost({1: 1.0, 2: 100.0}), max_nodes=16) == 0
    # each extra token costs 0.2 of a step: a node pays while its chance beats the running rate
    assert tree_size(chances, VerifyCost({1: 1.0, 2: 1.2, 17: 4.2}), max_nodes=16) == 3
    assert tree_size(chances, VerifyCost({1: 1.0, 17: 1.0}), max_nodes=2) == 2
    # the drafting already spent counts in every choice's step time: a long shot pays sooner
    assert tree_size(chances, VerifyCost({1: 1.0, 2: 1.2, 17: 4.2}), max_nodes=16, drafting=20.0) == 4
    assert VerifyCost({1: 1.0, 3: 2.0})(2) == 1.5 and VerifyCost({1: 1.0, 3: 2.0})(5) == 3.0  # interpolated, extended


def chain_tree(chances):
    """A chain of nodes, one per depth, with these uncalibrated chances."""
    tree = Tree()
    for i, chance in enumerate(chances):
        tree.add(i, i - 1, chance=chance)
    return tree


def test_calibration_scales_each_depth_by_what_the_target_accepted():
    """An under-confident head (its nodes accepted more often than it said) gets higher chances,
    an over-confident one lower, each depth on its own; a child never outranks its parent."""
    calibration = Calibration()
    assert calibration.chance(math.log(0.4), 1) == pytest.approx(0.4)  # no trees yet: the head's word
    for _ in range(200):  # depth 1 always accepted at a predicted 0.5; depth 2 never, at 0.4
        calibration.record(chain_tree([0.5, 0.4]), path=[0])
    assert calibration.scale(1) == pytest.approx(2.0, rel=0.05)
    assert calibration.scale(2) < 0.1
    assert calibration.chance(math.log(0.3), 1) == pytest.approx(0.6, rel=0.05)
    assert calibration.chance(math.log(0.6), 1) == 1.0  # a chance, at most 1
    assert calibration.chance(math.log(0.3), 2) < 0.03
    for _ in range(300):  # the text changes: depth 2 now always accepted; the counts follow it
        calibration.record(chain_tree([0.5, 0.4]), path=[0, 1])
    assert calibration.scale(2) == pytest.approx(2.5, rel=0.05)
    assert calibration.chance(math.log(0.4), 2, parent_chance=0.7) == 0.7  # never above its parent


def test_a_calibrated_tree_keeps_what_the_target_accepts(byte_tok):
    """The same head and step cost: calibrated to trust its deep nodes, the drafter verifies more
    of them; the chances it records stay the head's own (exp of the path's log-probability)."""
    model = tiny_model("mha_untied")
    cost = VerifyCost({1: 1.0, 2: 1.02, 17: 1.6})

    def tree_with(calibration):
        drafter, seq = ready_to_draft(model, byte_tok, calibration)
        return drafter.propose_tree(seq, 3, 4, 16, cost)

    trusting = Calibration()
    for _ in range(100):  # every drafted node accepted, at a predicted 0.05
        trusting.record(chain_tree([0.05, 0.05, 0.05]), path=[0, 1, 2])
    plain, calibrated = tree_with(Calibration()), tree_with(trusting)
    assert len(calibrated) > len(plain)
    assert len(calibrated.chances) == len(calibrated) and all(0 < c <= 1 for c in calibrated.chances)
    assert all(calibrated.chances[i] <= calibrated.chances[p] + 1e-6 for i, p in enumerate(calibrated.parents) if p >= 0)


def test_a_level_is_drafted_only_when_a_node_of_it_could_pay():
    """A deeper level is worth drafting when even its best possible node (as likely as its
    likeliest parent) beats the step's rate after paying for the level; a full tree needs a node
    likelier than its worst."""
    free, steep = VerifyCost({1: 1.0, 17: 1.0}), VerifyCost({1: 1.0, 2: 1.0, 3: 10.0})
    assert deeper_may_pay([0.5, 0.2], 0.5, free, 16, drafting=0.1, level_seconds=0.1)
    assert not deeper_may_pay([0.5, 0.2], 0.5, free, 16, drafting=0.1, level_seconds=5.0)  # the level costs too much
    assert not deeper_may_pay([0.5, 0.2], 0.5, steep, 16, drafting=0.1, level_seconds=0.01)  # its verify row does
    assert not deeper_may_pay([0.5, 0.2], 0.1, free, 2, drafting=0.1, level_seconds=0.01)  # full of likelier nodes
    assert deeper_may_pay([0.5, 0.2], 0.4, free, 2, drafting=0.1, level_seconds=0.01)
    assert not deeper_may_pay([0.5, 0.2], 0.9, free, 0, drafting=0.1, level_seconds=0.01)  # no room for a node


def test_a_tree_stops_where_deeper_nodes_cannot_pay(byte_tok):
    model = tiny_model("mha_untied")

    def tree_with(calibration, cost):
        drafter, seq = ready_to_draft(model, byte_tok, calibration)
        tree = drafter.propose_tree(seq, 4, 4, 64, cost)
        assert drafter.cache.num_tokens == len(PROMPT)
        return tree

    sure = Calibration()
    sure.scale = lambda depth: 1e9  # every node as sure as its parent: each level pays where rows are free
    assert max(tree_with(sure, VerifyCost({1: 100.0, 65: 100.0})).depths) == 4  # drafting is noise beside it
    # the untrained head's deeper nodes add less than another level's drafting costs
    tree = tree_with(Calibration(), VerifyCost({1: 1e-9, 2: 1e-9, 65: 1e-9}))
    assert len(tree) and max(tree.depths) == 1


def test_tree_speculation_records_every_verified_tree(byte_tok):
    model = tiny_model("gqa_tied")
    drafter = eagle(model)
    out, stats = run(stream_tree_speculative, model, byte_tok, drafter, verify_cost=VerifyCost({1: 1.0, 17: 1.0}))
    assert out == generate_cached(model, byte_tok, PROMPT, GREEDY).token_ids
    assert sum(drafter.calibration.predicted.values()) > 0  # the untrained head's trees were counted
    assert sum(drafter.calibration.accepted.values()) <= stats.accepted  # aged counts of accepted nodes


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("cost", [VerifyCost({1: 1.0, 17: 1.0}), VerifyCost({1: 1.0, 2: 1.3, 17: 6.0}),
                                  VerifyCost({1: 1.0, 2: 100.0})], ids=["free", "steep", "never"])
def test_cost_sized_trees_keep_stage02s_greedy_output(byte_tok, kind, cost):
    model = tiny_model("gqa_tied")
    ref = generate_cached(model, byte_tok, PROMPT, GREEDY).token_ids
    out, stats = run(stream_tree_speculative, model, byte_tok, eagle(model, kind=kind), verify_cost=cost)
    assert out == ref
    if cost(2) == 100.0:
        assert stats.proposed == 0  # no node pays: every step is a plain one


def test_verify_cost_is_measured_at_every_width():
    from course.s05_speculative.speculative import measure_verify_cost

    cost = measure_verify_cost(tiny_model("gqa_tied"), context=16, widths=(1, 2, 5), reps=1)
    assert sorted(cost.seconds) == [1, 2, 5] and all(s > 0 for s in cost.seconds.values())


def test_observed_features_keep_no_autograd_history(byte_tok):
    """A head's parameters require grad (it trains); drafting must never build a graph on them."""
    model = tiny_model("gqa_tied")
    drafter = eagle(model, kind="eagle3")
    assert any(p.requires_grad for p in drafter.head.parameters())
    out, _ = run(stream_speculative, model, byte_tok, drafter, k=3)
    assert not drafter.features.requires_grad


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_a_draft_just_below_the_buffers_end_has_room(byte_tok, drafting):
    """The head's buffers grow as positions arrive; a draft made when the known positions sit just
    below 256 (the first capacity) still fits: the buffers keep DRAFT_ROOM positions free."""
    model = tiny_model("mha_untied")
    drafter = eagle(model)
    ids = [(7 * i) % 250 + 1 for i in range(300)]
    hidden = forward_hidden(model, ContiguousKVAttention(KVCache(model.config, 300, model.dtype, model.device)), ids)
    drafter.begin(Sequence(ids[:60], GREEDY, byte_tok))
    drafter.observe(hidden[:60], 0)
    for t in range(60, 253):  # one position a step, as decoding brings them
        drafter.observe(hidden[t:t + 1], t)
    seq = Sequence(ids[:254], GREEDY, byte_tok)  # the known positions and the token after them
    draft = drafter.propose(seq, 4) if drafting == "chain" else drafter.propose_tree(seq, 5, top_k=4, max_nodes=16)
    assert len(draft.tokens) > 0
