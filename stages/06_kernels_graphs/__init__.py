"""Stage 06: Triton kernels on the paged KV cache, fused small kernels, CUDA graphs.

Without CUDA, Triton runs only through its interpreter, which must be switched on before any
kernel is decorated: this package does it first, for every module below it.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
