"""The memory benchmark's accounting: what each column means, checked on a short context."""
from course.s03_paged.bench.window_memory import BLOCK, MODELS, computed, measured_blocks


def test_window_memory_a_window_model_holds_its_window_and_a_chunk_the_others_everything():
    context, chunk = 2048, 256
    assert measured_blocks(MODELS["Mistral-7B-v0.1"], context, chunk) == context // BLOCK  # window 4096 > context
    small = {**MODELS["Mistral-7B-v0.1"], "window": 512}
    assert measured_blocks(small, context, chunk) <= (512 + chunk) // BLOCK + 2
    for name in ("gemma-3-1b", "gpt-oss-20b", "Qwen3-Next-80B-A3B"):  # a full-attention layer keeps every block
        assert measured_blocks(MODELS[name], context, chunk) == context // BLOCK


def test_window_memory_ideal_is_below_full_attention_for_every_model():
    for m in MODELS.values():
        c = computed(m, 8192)
        assert c["ideal_bytes"] < c["full_attention_bytes"]
