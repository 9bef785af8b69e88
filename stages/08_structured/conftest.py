from course.s08_structured.bench.fixtures import (smollm2_info, smollm2_llguidance, smollm2_tokenizer,  # noqa: F401
                                                 smollm2_xgrammar)
