"""What the closing planner costs a new grammar: its distances to the end (closing.py's
`min_accept_distance`, settled in Knuth's order with a heap) against the fixed point by a
worklist (a position evaluated again whenever a successor got shorter), side by side on the same automata: stage
08's examples and real-world schemas with the server's default bounds.

    python -m course.s08_structured.serving.bench_planner
"""
from __future__ import annotations

import statistics
import time
from collections import deque

from .closing import min_accept_distance


def distance_by_fixed_point(auto) -> list[float]:
    """The oracle: the fixed point by a worklist (Bellman-Ford): a position is evaluated again
    whenever one of its successors got shorter, until nothing shrinks."""
    inf, n = float("inf"), auto.num_positions
    targets: list[set[int]] = [set() for _ in range(n)]
    for p, t in auto.edges[:, [0, 3]].tolist():
        targets[p].add(t)
    preds: list[set[int]] = [set() for _ in range(n)]
    for p in range(n):
        for t in targets[p]:
            preds[t].add(p)
        for callee, ret in auto.calls[p]:
            preds[callee].add(p)
            preds[ret].add(p)
    dist = [0 if auto.final[p] else inf for p in range(n)]
    todo = deque(p for p in range(n) if auto.final[p])
    while todo:
        for p in preds[todo.popleft()]:
            best = min([dist[p]] + [1 + dist[t] for t in targets[p]] +
                       [dist[c] + dist[r] for c, r in auto.calls[p]])
            if best < dist[p]:
                dist[p] = best
                todo.append(p)
    return dist


def served_automata() -> dict:
    from ..automaton import compile_automaton
    from ..json_schema import SERVING_BOUNDS, json_schema_to_grammar
    from ..realworld.bench_finish import example_and_realworld_schemas

    return {name: compile_automaton(json_schema_to_grammar(s, mode="best-effort", default_bounds=SERVING_BOUNDS),
                                    minimize_positions=False)
            for name, s in example_and_realworld_schemas().items()}


def best_of(f, auto, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f(auto)
        times.append(time.perf_counter() - start)
    return min(times)


def run() -> dict:
    rows = []
    for name, auto in served_automata().items():
        if min_accept_distance(auto) != distance_by_fixed_point(auto):
            raise AssertionError(f"{name}: the two ways disagree")
        rows.append({"schema": name, "positions": auto.num_positions,
                     "knuth_ms": best_of(min_accept_distance, auto) * 1e3,
                     "fixed_point_ms": best_of(distance_by_fixed_point, auto) * 1e3})
    knuth = statistics.median(r["knuth_ms"] for r in rows)
    fixed = statistics.median(r["fixed_point_ms"] for r in rows)
    return {"rows": rows, "median_knuth_ms": knuth, "median_fixed_point_ms": fixed, "ratio": fixed / knuth}


def main() -> None:
    result = run()
    for r in result["rows"]:
        print(f"{r['schema']:<40}{r['positions']:>7} positions  {r['knuth_ms']:7.2f} ms  (worklist "
              f"{r['fixed_point_ms']:7.2f})")
    print(f"median: Knuth's order {result['median_knuth_ms']:.2f} ms, worklist {result['median_fixed_point_ms']:.2f} "
          f"ms: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
