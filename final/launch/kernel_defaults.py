"""Stage 06's kernel options as the server picks them for a device: one place, used by the
CLI and by every benchmark that measures "the engine as served".

The device itself: `auto` is CUDA when torch sees a card, else the CPU; dtype `auto` is
bfloat16 weights and KV on CUDA, float32 on the CPU.

On CUDA: the Triton kernels (stage 06's gpu/ room's tensor-core set; elsewhere the lesson's),
fused ops, decode graphs and overlap scheduling (a steady decode step launched before the
previous one's tokens are read). On the CPU: stage 06's C attention
kernel when a float32 pool and a C compiler allow it (else the PyTorch backend), the fused
model with every linear split over the intra-op threads (torch's CPU linear runs a decode
step's GEMVs on one thread: split_linear.py), no graphs (the CPU stand-in only checks
capturability). Options the user set are kept; unset ones (None) get the default.

Importing this module plugs stage 06's rooms into its engine (the cpu backend and linears, the
gpu kernel set, overlap), as stage 06's own command line does."""
from __future__ import annotations

from typing import Callable

import torch

from course.s06_kernels_graphs.cli import register_rooms
from course.s06_kernels_graphs.cpu.attention import kernel_unavailable

register_rooms()


def pick_device(name: str = "auto", cuda_available: Callable[[], bool] = torch.cuda.is_available) -> str:
    """`auto`: "cuda" when torch sees a card, else "cpu"; any other name as given."""
    if name != "auto":
        return name
    return "cuda" if cuda_available() else "cpu"


def pick_dtype(name: str, device: str) -> torch.dtype:
    """`auto`: bfloat16 on CUDA (half the bytes a step reads), float32 on the CPU (where
    stage 06's C kernel and the exact-equality tests want it); any other name as given."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def kernel_defaults(device: str = "cpu", dtype: torch.dtype = torch.float32, *, attention_backend: str | None = None,
                    cuda_graphs: bool | None = None, fused: bool | None = None, linear_splits: int | None = None,
                    quantization: str | None = None, overlap: bool | None = None) -> dict:
    cuda = device.startswith("cuda")
    graphs = cuda if cuda_graphs is None else cuda_graphs
    overlap = cuda if overlap is None else overlap
    if attention_backend is None:
        native = not cuda and not graphs and dtype == torch.float32 and kernel_unavailable() is None
        attention_backend = "triton" if cuda else "cpu" if native else "torch"
    splits = linear_splits if linear_splits is not None else (1 if cuda else torch.get_num_threads())
    fused = fused if fused is not None else (cuda or splits > 1 or quantization is not None)
    if (splits > 1 or quantization) and not fused:
        raise ValueError(f"{'--quantization' if quantization else '--linear-splits'} needs the fused model: "
                         "drop --no-fused")
    return {"attention_backend": attention_backend, "cuda_graphs": graphs, "fused": fused, "linear_splits": splits,
            "quantization": quantization, "overlap": overlap, "triton_kernels": "gpu" if cuda else "lesson"}


def describe(options: dict, device: str = "cpu", dtype: torch.dtype = torch.float32) -> str:
    """One line for the server's start-up: what runs, and why the C kernel does not if it could."""
    kernels = f" ({options.get('triton_kernels', 'lesson')} kernels)" if options["attention_backend"] == "triton" else ""
    parts = [f"attention {options['attention_backend']}{kernels}", "fused" if options["fused"] else "unfused",
             f"linears split {options['linear_splits']}"]
    parts += ["CUDA graphs"] * options["cuda_graphs"] + ["overlap"] * options.get("overlap", False)
    parts += [options["quantization"] or ""]
    line = "kernels: " + ", ".join(p for p in parts if p)
    reason = kernel_unavailable() if options["attention_backend"] == "torch" and device == "cpu" else None
    if reason and dtype == torch.float32:
        line += f" (the C kernel is unavailable: {reason})"
    return line
