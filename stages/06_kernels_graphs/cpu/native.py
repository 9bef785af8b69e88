"""C kernels for the CPU: compiled once per machine with the system compiler, loaded with ctypes.

Where Triton does not compile (the CPU: CI runs the Triton kernels through its interpreter), a
few loops in C do what no sequence of torch ops can: read the paged pool in place
(attention.c), or do a norm's or RoPE's work in one pass instead of ten (ops.c).

The library is built with `$CC` (default `cc`) into `$COURSE_KERNEL_CACHE` (default
~/.cache/course-kernels), keyed by the source, the flags, the compiler and the machine
(-march=native, or `$COURSE_CPU_ARCH`), so an edit or another CPU rebuilds it. It links the OpenMP runtime torch has
already loaded (torch's wheel ships libgomp.so.1 under that name), so its threads are torch's.
Without a compiler, `KernelUnavailable` says why and the engine keeps its PyTorch code.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

# $COURSE_CPU_ARCH builds for another target than this CPU (haswell: AVX2 + FMA only, the Zen 3
# hosts' instructions), so one machine can measure another's path (with torch's own switches,
# ONEDNN_MAX_CPU_ISA=AVX2 and ATEN_CPU_CAPABILITY=avx2)
BASE_FLAGS = ["-O3", f"-march={os.environ.get('COURSE_CPU_ARCH') or 'native'}", "-fopenmp", "-fPIC"]
# Linked in a second command, without the compile flags: given -ffast-math at link time, gcc adds
# crtfastmath.o, whose constructor turns on flush-to-zero for the whole process (torch included).
LINK_FLAGS = ["-shared", "-fopenmp"]
_LOADERS = []


class KernelUnavailable(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("COURSE_KERNEL_CACHE") or Path.home() / ".cache" / "course-kernels")


def compile_library(source: Path, flags: list[str]) -> Path:
    """The shared library for `source`, compiled on first use (atomically: concurrent
    processes each compile aside and rename)."""
    compiler = os.environ.get("CC", "cc")
    if not source.exists():
        raise KernelUnavailable(f"{source.name} is not installed beside {Path(__file__).name}")
    key = hashlib.sha256(_with_includes(source) + " ".join([compiler, *flags, *LINK_FLAGS, platform.machine(),
                                                             platform.node()]).encode())
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built, obj = Path(tmp) / target.name, Path(tmp) / f"{source.stem}.o"
        for command in ([compiler, *flags, "-c", str(source), "-o", str(obj)],
                        [compiler, *LINK_FLAGS, str(obj), "-o", str(built), "-lm"]):
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise KernelUnavailable(f"no C compiler ({compiler}): {e}") from None
            if done.returncode:
                raise KernelUnavailable(f"{compiler} failed on {source.name}: {done.stderr.strip()[-500:]}")
        os.replace(built, target)
    return target


def _with_includes(source: Path) -> bytes:
    """The source and every file it #includes "by name" from beside it (layer.c includes
    ops.c and attention.c): a change to any of them means a new library."""
    text = source.read_bytes()
    for line in text.splitlines():
        parts = line.decode(errors="replace").split('"')
        if line.lstrip().startswith(b"#include") and len(parts) == 3 and (source.parent / parts[1]).exists():
            text += _with_includes(source.parent / parts[1])
    return text


def load(source: Path, flags: list[str]) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(compile_library(source, flags)))  # calls release the GIL
    except OSError as e:
        raise KernelUnavailable(f"could not load {source.name}'s library: {e}") from None


def cached_loader(fn):
    """Memoize a module's `_library()` (one compile and load per process); `forget_loaded`
    clears them all (tests that take the compiler away)."""
    cached = functools.lru_cache(maxsize=None)(fn)
    _LOADERS.append(cached)
    return cached


def forget_loaded() -> None:
    for loader in _LOADERS:
        loader.cache_clear()


def unavailable(loader) -> str | None:
    """None when `loader()` compiles and loads here, else the reason."""
    try:
        loader()
    except KernelUnavailable as e:
        return str(e)
    return None
