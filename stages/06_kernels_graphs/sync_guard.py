"""What a CUDA graph cannot capture, refused on any device.

A CUDA graph records the kernels a step launches and replays them later with no Python in
between. Whatever the step learned on the host at capture time is frozen into the graph, and
whatever makes the host wait for the device is refused outright (capture raises). So a
graph-captured step must never:

* read a tensor's value on the host: `.item()`, `.tolist()`, `int(t)`, `if t > 0:`
  (all wait for the device: a *host sync*);
* produce a tensor whose shape depends on its values: `nonzero`, boolean-mask indexing
  `x[mask]`, `masked_select`, `unique` (the output size is only known after a sync);
* build a tensor from Python data inside the step: `torch.tensor([...])` is a host-to-device
  copy whose values would be frozen into the graph at capture.

`sync_guard` raises `GraphCaptureError` on each of these, on the CPU too, so the graph runner's
logic is tested on machines without CUDA. Allocating intermediate results is fine:
under capture they come from the graph's private memory pool, at the same address each replay.
Triton launches pass too: their wrappers read only shapes, and the CPU interpreter's own copies
are none of the operations above, so the guard checks the Triton backend's steps whole.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class GraphCaptureError(RuntimeError):
    """The step did something a CUDA graph cannot capture."""


# Python-level tensor methods that read values on the host (seen by TorchFunctionMode).
_HOST_READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
               "masked_select", "unique", "unique_consecutive"}
# aten ops (seen by TorchDispatchMode): what the methods above, and other paths to them, lower to.
_FORBIDDEN_OPS = {
    "aten._local_scalar_dense": "reads a tensor's value on the host (.item(), int(t), if t: ...)",
    "aten.nonzero": "has a value-dependent output shape (nonzero)",
    "aten.masked_select": "has a value-dependent output shape (masked_select)",
    "aten._unique2": "has a value-dependent output shape (unique)",
    "aten.unique_consecutive": "has a value-dependent output shape (unique_consecutive)",
    "aten.lift_fresh": "builds a tensor from Python data inside the step (torch.tensor(...))",
}

class _HostReadRefuser(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            raise GraphCaptureError(f"`{name}` forces a host sync; a CUDA graph cannot capture it")
        return func(*args, **(kwargs or {}))


class _OpRefuser(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.name().split(".")[0].replace("::", ".")
        if op in _FORBIDDEN_OPS:
            raise GraphCaptureError(f"{func.name()} {_FORBIDDEN_OPS[op]}; a CUDA graph cannot capture it")
        if op == "aten.index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                      for i in (args[1] if len(args) > 1 else ())):
            raise GraphCaptureError("boolean-mask indexing has a value-dependent output shape; "
                                    "a CUDA graph cannot capture it (use torch.where or a fixed-size gather)")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def sync_guard():
    """Run a block as a graph capture would: every forbidden operation raises GraphCaptureError."""
    with _HostReadRefuser(), _OpRefuser():
        yield
