from course.s08_structured.bench.fixtures import smollm2_info, smollm2_tokenizer, smollm2_xgrammar  # noqa: F401
