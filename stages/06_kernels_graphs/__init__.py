"""Stage 06: Triton kernels that read the paged KV cache directly, fused small kernels, and
CUDA graphs around the decode step, behind stage 01's attention seam.

Without CUDA, Triton can only run through its interpreter, and the interpreter must be
switched on before any kernel is decorated, so this package does it first, for every module
below it. On a GPU machine nothing changes.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
