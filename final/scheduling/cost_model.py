"""How long one engine step takes, as a function of what the step carries.

The scheduler's choices are all about time (who waits, for how long), but a policy must not
read the wall clock: its decisions would change from run to run and no test could pin them. So
MLFQ measures service, and the simulator measures time, with a *cost model*: a formula fitted
to this engine's measured steps (`python -m course.final.scheduling.cost_model --out FILE`), or derived
from a GPU's published figures (`gpu_like()`, stated as such everywhere it is used).

A step is described by three numbers: the tokens it runs (every prefill-chunk and decode row),
the sequences they belong to (one logits row and one sampler each), and the KV tokens those
sequences attend to (what attention reads). `step_time(tokens, seqs, kv_tokens)` in seconds.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).parent.parent / "results"
MEASURED_CPU = RESULTS / "cost_model_2core_cpu.json"
GPU_LIKE = RESULTS / "cost_model_gpu_like_a100_7b.json"


@dataclass
class LinearCostModel:
    """Fitted to measured steps: a fixed part (reading the weights once, Python), plus a part per
    token (the matmuls), per sequence (lm_head row, sampling, metadata) and per KV token read."""
    fixed_s: float
    per_token_s: float
    per_seq_s: float
    per_kv_token_s: float
    source: str = ""

    kind = "linear"

    def step_time(self, num_tokens: int, num_seqs: int, num_kv_tokens: int = 0) -> float:
        if num_tokens == 0:
            return 0.0
        return (self.fixed_s + self.per_token_s * num_tokens + self.per_seq_s * num_seqs
                + self.per_kv_token_s * num_kv_tokens)


@dataclass
class RooflineCostModel:
    """A GPU-like step: whichever is slower, moving the bytes (weights once + the KV read) at
    the achievable memory bandwidth, or the FLOPs at the achievable throughput, plus a fixed
    per-step overhead. Derived from published figures, not measured."""
    num_params: float
    bytes_per_param: float
    kv_bytes_per_token: float
    memory_bytes_per_s: float
    flops_per_s: float
    fixed_s: float
    source: str = ""

    kind = "roofline"

    def step_time(self, num_tokens: int, num_seqs: int, num_kv_tokens: int = 0) -> float:
        if num_tokens == 0:
            return 0.0
        memory = (self.num_params * self.bytes_per_param + self.kv_bytes_per_token * num_kv_tokens) \
            / self.memory_bytes_per_s
        compute = 2 * self.num_params * num_tokens / self.flops_per_s
        return self.fixed_s + max(memory, compute)


CostModel = LinearCostModel | RooflineCostModel


def gpu_like() -> RooflineCostModel:
    """Llama-2-7B in fp16 on one A100-80GB SXM. Published: 2.04 TB/s HBM, 312 TFLOP/s dense
    bf16. Assumed achievable: 80% of the bandwidth, 50% of the FLOPs, 3 ms of scheduling and
    launches per step. KV per token: 2 (K, V) x 32 layers x 4096 x 2 bytes."""
    return RooflineCostModel(num_params=6.74e9, bytes_per_param=2, kv_bytes_per_token=2 * 32 * 4096 * 2,
                             memory_bytes_per_s=0.8 * 2.04e12, flops_per_s=0.5 * 312e12, fixed_s=0.003,
                             source="GPU-like, derived (not measured): Llama-2-7B fp16 on an A100-80GB SXM, "
                                    "80% of 2.04 TB/s, 50% of 312 TFLOP/s, 3 ms fixed per step")


def save(model: CostModel, path: str | Path, extra: dict | None = None) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"kind": model.kind, **asdict(model), **(extra or {})}, indent=1) + "\n")


def load(path: str | Path = MEASURED_CPU) -> CostModel:
    data = json.loads(Path(path).read_text())
    cls = {"linear": LinearCostModel, "roofline": RooflineCostModel}[data.pop("kind")]
    return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m course.final.scheduling.cost_model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(MEASURED_CPU), help="where the fitted model goes (JSON)")
    p.add_argument("--model", help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--repeats", type=int, default=3, help="timings per point; the fastest is kept")
    p.add_argument("--gpu-like", action="store_true", help="write the derived GPU-like model instead of measuring")
    args = p.parse_args(argv)
    if args.gpu_like:
        save(gpu_like(), args.out)
        print(f"wrote {args.out}")
        return 0
    from .measure_cost import fit, measure_points

    points = measure_points(args.model, repeats=args.repeats)
    model, errors = fit(points)
    save(model, args.out, {"points": points, "relative_errors": errors})
    print(json.dumps(asdict(model), indent=1))
    print(f"relative error of the fit per point: median {sorted(map(abs, errors))[len(errors) // 2]:.1%}, "
          f"max {max(map(abs, errors)):.1%}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
