"""The memory benchmark's accounting: what each column means, checked on a short context."""
from course.s03_paged.bench.window_memory import BLOCK, MODELS, computed, measured


def test_window_memory_each_group_holds_its_window_and_a_chunk_full_layers_everything():
    context, chunk = 2048, 256
    assert measured(MODELS["Mistral-7B-v0.1"], context, chunk)[1] == [context // BLOCK]  # window 4096 > context
    small = {**MODELS["Mistral-7B-v0.1"], "window": 512}
    assert measured(small, context, chunk)[1][0] <= (512 + chunk) // BLOCK + 2
    for name in ("gemma-3-1b", "gpt-oss-20b"):  # a group per kind of layer: the full one keeps every block
        m = MODELS[name]
        kv, (full, sliding) = measured(m, context, chunk)
        assert full == context // BLOCK and sliding <= (m["window"] + chunk) // BLOCK + 2
        per_layer_block = BLOCK * 2 * m["kv_heads"] * m["head_dim"] * 2
        layers_full = m["layers"].count("full_attention")
        assert kv == (full * layers_full + sliding * (len(m["layers"]) - layers_full)) * per_layer_block
    assert measured(MODELS["Qwen3-Next-80B-A3B"], context, chunk)[1] == [context // BLOCK]  # its attention layers


def test_window_memory_ideal_is_below_full_attention_for_every_model():
    for m in MODELS.values():
        c = computed(m, 8192)
        assert c["ideal_bytes"] < c["full_attention_bytes"]
