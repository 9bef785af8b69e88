"""Training-time test computes exactly what chain drafting computes; the draft vocabulary only
ever drafts its own tokens; the accepted-length figure counts leading hits."""
import pytest
import torch

from course.s01_decode_loop.attention import AttentionMetadata, FullCausalAttention
from course.s01_decode_loop.testing import tiny_model
from course.s02_kv_cache.generate import step_metadata
from course.s02_kv_cache.kv_cache import ContiguousKVAttention, KVCache
from course.s05_speculative.eagle import EagleHead
from course.s05_speculative.eagle3 import Eagle3Head
from course.s05_speculative.training.eagle_training import accepted_lengths, step_losses, unrolled_predictions


def head_and_inputs(model, lengths, seed=0, kind="eagle"):
    """A head, and inputs as the target gives them: final hidden states, or for EAGLE-3 its taps."""
    torch.manual_seed(seed)
    head = (Eagle3Head(model.config) if kind == "eagle3" else EagleHead(model.config)).eval()
    h, total = model.config.hidden_size, sum(lengths)
    features = torch.randn(total, h * max(1, len(head.tap_layers)))
    tokens = torch.randint(0, model.config.vocab_size, (total,))
    return head, features, model.model.embed_tokens(tokens), AttentionMetadata.for_full_sequences(lengths)


def chain_from(head, features, embeds, base):
    """What EagleDrafter does: true entries for positions 0..base in the head's cache, then each
    step feeds back its own prediction; returns the predictions of steps 0, 1, ..."""
    cache = KVCache(head.config, 64, features.dtype, features.device)
    out = head(head.input_features(features[:base + 1]), embeds[:base + 1], ContiguousKVAttention(cache), step_metadata(0, base + 1, "cpu"))
    preds = [out[-1]]
    for j in range(1, len(embeds) - base):
        position = base + j
        nxt = head(preds[-1][None], embeds[position:position + 1], ContiguousKVAttention(cache),
                   step_metadata(position, 1, "cpu"))
        preds.append(nxt[0])
    return preds


@pytest.mark.parametrize("config,kind", [("mha_untied", "eagle"), ("gqa_tied", "eagle"), ("mqa_odd_heads", "eagle"),
                                         ("mha_untied", "eagle3"), ("mqa_odd_heads", "eagle3")])
def test_unrolled_steps_equal_chain_drafting_from_every_base(config, kind):
    model = tiny_model(config)
    lengths = [9, 6]  # two packed sequences: nothing may leak across the boundary
    head, features, embeds, meta = head_and_inputs(model, lengths, kind=kind)
    with torch.no_grad():
        preds = unrolled_predictions(head, embeds, features, meta, steps=4)
        step0 = head(head.input_features(features), embeds, FullCausalAttention(), meta)
    torch.testing.assert_close(preds[0], step0)  # step 0 is EAGLE-1's teacher-forced step
    for start, length in zip([0, 9], lengths):
        f, e = features[start:start + length], embeds[start:start + length]
        for base in range(length):
            with torch.no_grad():
                chain = chain_from(head, f, e, base)
            for j in range(min(4, length - base)):
                torch.testing.assert_close(preds[j][start + base + j], chain[j], atol=2e-5, rtol=1e-4,
                                           msg=f"base {base}, step {j}")


def test_draft_vocabulary_drafts_only_its_tokens_and_round_trips(tmp_path):
    model = tiny_model("mha_untied")
    vocab = torch.tensor([7, 3, 40, 99])
    torch.manual_seed(0)
    head = EagleHead(model.config, vocab).eval()
    features = torch.randn(5, model.config.hidden_size)
    logits = head.draft_logits(model, features)
    assert set(logits.argmax(-1).tolist()) <= {3, 7, 40, 99}
    torch.testing.assert_close(logits[:, [3, 7, 40, 99]], model.compute_logits(features)[:, [3, 7, 40, 99]])
    assert torch.isinf(logits).sum() == 5 * (model.config.vocab_size - 4)
    head.save(tmp_path / "h.safetensors")
    again = EagleHead.load(tmp_path / "h.safetensors", model)
    assert again.draft_vocab.tolist() == [3, 7, 40, 99]
    torch.testing.assert_close(again.draft_logits(model, features), logits, atol=0.05, rtol=0.05)  # bf16 weights
    # a tree's expansion reads the top tokens off the draft vocabulary's softmax alone: the same
    # log-probabilities and tokens as the whole vocabulary's (the rest are -inf)
    values, ids = head.draft_top(model, features, 3)
    want = torch.log_softmax(logits, dim=-1).topk(3, dim=-1)
    torch.testing.assert_close(values, want.values)
    assert ids.tolist() == want.indices.tolist()


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_step_losses_count_only_rows_with_a_base_and_train_every_step(kind):
    model = tiny_model("mha_untied")
    head, features, embeds, meta = head_and_inputs(model, [5, 4], kind=kind)
    head.train()
    counted = torch.ones(9, dtype=torch.bool)
    preds = unrolled_predictions(head, embeds, features, meta, steps=3)
    loss = step_losses(head, model, preds, torch.randn(9, model.config.hidden_size), counted, meta)
    loss.backward()
    assert torch.isfinite(loss) and head.fc.weight.grad.abs().sum() > 0
    if kind == "eagle3":  # the fusing layer and the readout norm train with the rest
        assert head.fuse.weight.grad.abs().sum() > 0 and head.norm.weight.grad.abs().sum() > 0
    # a step whose rows all lack a base adds nothing: 5 steps on sequences of <= 5 rows
    preds = unrolled_predictions(head, embeds, features, meta, steps=6)
    with torch.no_grad():
        five = step_losses(head, model, preds[:5], torch.zeros(9, model.config.hidden_size), counted, meta)
        six = step_losses(head, model, preds, torch.zeros(9, model.config.hidden_size), counted, meta)
    torch.testing.assert_close(five, six)


def test_accepted_length_counts_leading_hits_only():
    hits = torch.tensor([[1, 1, 0, 1, 1],
                         [0, 1, 1, 1, 1],
                         [1, 1, 1, 0, 1]], dtype=torch.bool)
    # base 0: hits[0,0]=1, hits[1,1]=1, hits[2,2]=1 -> 4; base 1: hits[0,1]=1, hits[1,2]=1, hits[2,3]=0 -> 3
    # base 2: hits[0,2]=0 -> 1
    assert accepted_lengths(hits, torch.tensor([0, 1, 2]), k=3).tolist() == [4.0, 3.0, 1.0]
    assert accepted_lengths(hits, torch.tensor([0, 1, 2]), k=1).tolist() == [2.0, 2.0, 1.0]
