"""Scheduling studied offline: a cost model of the engine's step, a simulator that replays the
scheduler on it, traces, metrics and the scheduling benchmarks."""
