"""The builds of attention.c the window and sink tests run through (`build`)."""
import ctypes

import pytest

from course.s06_kernels_graphs.cpu import attention as cpu_attention
from course.s06_kernels_graphs.cpu import native

# this CPU's (AVX-512), an AVX2 host's (plain score and value loops, 8-wide dequantization), and one
# with no vector code of its own at all
BUILDS = {"avx512": [], "avx2": ["-mno-avx512f"], "plain": ["-mno-avx512f", "-mno-avx2", "-mno-f16c"]}


@pytest.fixture(params=list(BUILDS))
def build(request, monkeypatch):
    """paged_attention_rows through attention.c compiled as the build names."""
    if BUILDS[request.param]:
        fn = native.load(cpu_attention.SOURCE, cpu_attention.FLAGS + BUILDS[request.param]).paged_attention_rows_f32
        fn.argtypes, fn.restype = cpu_attention._library().argtypes, ctypes.c_int64
        monkeypatch.setattr(cpu_attention, "_library", lambda: fn)
    return request.param
