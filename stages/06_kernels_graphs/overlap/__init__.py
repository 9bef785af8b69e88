"""Overlap scheduling: the device runs step N+1 while the host post-processes step N
(pipeline.py)."""
from .pipeline import InFlight, OverlapScheduler

__all__ = ["InFlight", "OverlapScheduler"]
