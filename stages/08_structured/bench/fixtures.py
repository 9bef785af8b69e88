"""Fixtures every test folder of stage 08 shares (the stage's conftest.py imports them)."""
import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real model's tokenizer alone (49,152 tokens), without loading its weights."""
    from transformers import AutoTokenizer

    from course.s01_decode_loop.default_model import ensure_default_model

    return AutoTokenizer.from_pretrained(ensure_default_model())


@pytest.fixture(scope="session")
def smollm2_info(smollm2_tokenizer):
    from course.s08_structured.vocab import TokenizerInfo

    return TokenizerInfo.from_huggingface(smollm2_tokenizer, vocab_size=49152)


@pytest.fixture(scope="session")
def smollm2_xgrammar(smollm2_tokenizer, smollm2_info):
    """xgrammar's compiler (the outside reference) for the same vocabulary, built once."""
    pytest.importorskip("xgrammar")
    from course.s08_structured.bench.testing import xgrammar_compiler

    return xgrammar_compiler(smollm2_tokenizer, smollm2_info.vocab_size)


@pytest.fixture(scope="session")
def smollm2_llguidance(smollm2_tokenizer, smollm2_info):
    """llguidance's tokenizer (the second outside reference) for the same vocabulary, built once."""
    pytest.importorskip("llguidance")
    from course.s08_structured.bench.testing import llguidance_tokenizer

    return llguidance_tokenizer(smollm2_tokenizer, smollm2_info.vocab_size)
