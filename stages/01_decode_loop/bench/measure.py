"""How every benchmark in the course measures and reports: one small harness.

A benchmark module defines `add_args(parser)`, `run(args) -> result` and `report(result)`, and
ends with `main = bench_cli(__doc__, add_args, run, report)`. The harness gives it the shared
command line (`--json PATH`, `--results`), times with warm-up excluded, names the machine, and
writes results as JSON stamped with the machine and the command that made them, so a README's
figure can point at the file it came from (`tests/test_docs.py` checks that it does).

    python -m course.sNN_name.bench.benchmark --results   # writes stages/NN_name/results/benchmark.json
    python -m course.sNN_name.bench.benchmark --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch


def cpu_threads() -> int:
    """The threads torch should use: OMP_NUM_THREADS where it is set (an operator's choice, or a
    share of a machine others work on too, as the parallel test runner sets it), else every core
    the machine shows (torch's own default counts physical cores only)."""
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def cpu_name() -> str:
    """The processor's model name (lscpu's), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What a figure needs beside it to mean anything: the host, its cores, torch, the device."""
    info = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def machine_line() -> str:
    m = machine()
    gpu = f", {m['gpu']}" if "gpu" in m else ""
    return f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} threads{gpu}"


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work, so a timer measures the work and not its launch."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable, *args, device=None, **kwargs) -> float:
    """Seconds one call takes, the device synchronised on both sides."""
    sync(device)
    start = time.perf_counter()
    fn(*args, **kwargs)
    sync(device)
    return time.perf_counter() - start


def best_of(fn: Callable, *args, repeats: int = 3, warmup: int = 1, device=None, **kwargs) -> float:
    """The fastest of `repeats` timed calls after `warmup` untimed ones (noise only adds time)."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    return min(timed(fn, *args, device=device, **kwargs) for _ in range(repeats))


def median_of(fn: Callable, *args, repeats: int = 5, warmup: int = 1, device=None, **kwargs) -> float:
    """The median of `repeats` timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    return statistics.median(timed(fn, *args, device=device, **kwargs) for _ in range(repeats))


def per_token_seconds(token_times: list[float]) -> list[float]:
    """What each token took, from a GenerationOutput's `token_times_s` (each token's time since
    the request started): token 0's is the time to the first token."""
    return [b - a for a, b in zip([0.0] + token_times[:-1], token_times)]


def percentile(values, q: float) -> float | None:
    """The q-th percentile (q in 0..100), interpolated between the two closest ranks as numpy's
    default is; None for no values. Every latency percentile in the course is this one."""
    ordered = sorted(values)
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def code_version() -> str | None:
    """The commit the measured code was at (`git rev-parse`), `+dirty` when files differ from
    it; None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def write_json(path: str | Path, result) -> None:
    """The result, indented; a dict result is stamped with the machine, the command line and the
    commit of the code that measured it."""
    if isinstance(result, dict):
        result = {**result, "machine": result.get("machine", machine()),
                  "command": result.get("command", command_line()),
                  "commit": result.get("commit", code_version())}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def command_line() -> str:
    """`python -m package.module args...` for the running benchmark."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None else Path(sys.argv[0]).name
    return " ".join(["python -m", name.removesuffix(".__main__"), *sys.argv[1:]])


def results_path(module: str) -> Path:
    """Where `--results` writes: the stage's (or final/'s) results/ folder, named for the module.
    `course.s04_continuous_batching.bench.benchmark` -> stages/04_continuous_batching/results/benchmark.json."""
    package = sys.modules[module.rsplit(".", 1)[0]]
    folder = Path(package.__file__).resolve().parent
    while folder.parent.name != "stages" and folder.name != "final":  # up from a sub-package
        if folder == folder.parent:
            raise ValueError(f"no stage folder above {module}")
        folder = folder.parent
    return folder / "results" / f"{module.rsplit('.', 1)[1]}.json"


def bench_cli(doc: str | None, add_args: Callable[[argparse.ArgumentParser], None],
              run: Callable[[argparse.Namespace], Any], report: Callable[[Any], None],
              module: str | None = None) -> Callable[[list[str] | None], Any]:
    """The `main` of a benchmark: parse, run, print the report, write JSON where asked."""

    def main(argv: list[str] | None = None):
        p = argparse.ArgumentParser(prog=f"python -m {module}" if module else None, description=doc,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        add_args(p)
        p.add_argument("--json", metavar="PATH", help="also write the result to this file")
        if module:
            p.add_argument("--results", action="store_true",
                           help=f"also write it to the stage's results folder ({results_path(module).name})")
        args = p.parse_args(argv)
        result = run(args)
        print(machine_line())
        report(result)
        for path in [args.json, module and args.results and results_path(module)]:
            if path:
                write_json(path, result)
                print(f"wrote {path}")
        return result

    return main
