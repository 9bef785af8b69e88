"""Scheduling beyond stage 04's FCFS and priorities: FastServe's skip-join MLFQ (policies.py),
the cost model it counts service with, a simulator that replays the real scheduler on that
model, the real engine on the same clock (replay.py), traces, metrics and the benchmarks."""
