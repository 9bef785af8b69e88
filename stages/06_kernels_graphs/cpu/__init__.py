"""The CPU room: stage 06's ideas where Triton does not compile. C kernels (compiled on first
use, native.py) that read the paged pool in place (attention.c), fuse the small ops (ops.c)
and run a whole decoder layer in one call (layer.c, int8.c); the cpu attention backend that
offers them through the backend seam (backend.py); the linears the CPU needs (split across
cores, int8 weights) and the settings that choose them (settings.py)."""
