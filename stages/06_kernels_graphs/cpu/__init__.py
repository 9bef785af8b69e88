"""The CPU room: stage 06's ideas where Triton does not compile. C kernels (compiled on first
use, native.py) that read the paged pool in place (attention.c), fuse the small ops (ops.c)
and run a whole decoder layer in one call (layer.c, int8.c); the cpu attention backend that
offers them through the backend seam (backend.py); the torch backend's eager steps planned
into SDPA calls, the CPU's fallback without a compiler (planned.py); the linears the CPU needs
(split across cores, int8 weights) and the engine extension that applies them (extension.py)."""


def register() -> None:
    """Plug the room into the lesson: the "cpu" attention backend, the planned eager steps of
    the "torch" backend (in its place: the same results, sooner), and the engine options
    `linear_splits`, `quantization` and `one_call_layers`."""
    from ..engine import register_backend, register_extension
    from .backend import CpuPagedBackend
    from .extension import CpuLinears
    from .planned import PlannedTorchBackend

    register_backend(CpuPagedBackend)
    register_backend(PlannedTorchBackend)
    register_extension("cpu", CpuLinears.of)
