"""Overlap scheduling: the device runs step N+1 while the host post-processes step N
(pipeline.py)."""
from .pipeline import InFlight, OverlapScheduler

__all__ = ["InFlight", "OverlapScheduler", "register"]


def register() -> None:
    """Plug the room into the lesson: the engine option `overlap`."""
    from ..engine import register_extension

    register_extension("overlap", OverlapScheduler.of)
