"""The KV-size calculator against numbers worked out by hand."""
import pytest
import torch

from course.s02_kv_cache.kv_size import LLAMA3_70B, human, kv_bytes_per_request, kv_bytes_per_token


def test_kv_size_llama3_70b_by_hand():
    # 2 (K,V) x 80 layers x 8 KV heads x 128 dims x 2 bytes (bf16) = 327,680 bytes = 320 KiB per token
    assert kv_bytes_per_token(LLAMA3_70B, torch.bfloat16) == 327_680
    # a 4096-token request: 1,342,177,280 bytes = 1.25 GiB; in float8 half of that
    assert kv_bytes_per_request(LLAMA3_70B, 4096, torch.bfloat16) == 1_342_177_280
    assert kv_bytes_per_request(LLAMA3_70B, 4096, torch.float8_e4m3fn) == 671_088_640
    assert human(1_342_177_280) == "1.25 GiB" and human(327_680) == "320 KiB"


@pytest.mark.slow
def test_kv_size_real_model_by_hand(smollm2):
    # SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64 dims = 11,520 elements per token
    assert kv_bytes_per_token(smollm2.config, torch.float32) == 46_080
    assert kv_bytes_per_token(smollm2.config, torch.bfloat16) == 23_040
    assert kv_bytes_per_request(smollm2.config, 8192, torch.bfloat16) == 188_743_680  # 180 MiB at full context


def test_kv_size_human_units():
    assert human(512) == "512 B"
    assert human(46_080) == "45 KiB"
    assert human(188_743_680) == "180 MiB"
