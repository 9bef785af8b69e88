"""Keep torch's parallel work off the server's main thread.

The server steps the engine on its own thread ("engine-loop") while the main thread runs the
event loop. If the main thread has ever run a parallel torch op (loading the model does:
copies, concatenating the fused weights, zeroing the KV pool), OpenMP keeps a second team of
worker threads for it, and on a small machine that team slows every op the engine thread runs.
Measured on our 2-core CPU, the same engine stepped from a thread: 15.0-17.5 tok/s single
stream when the main thread loaded the model, 21.0-23.8 tok/s when a short-lived thread did
(`python -m course.final.bench.profile` runs on the main thread throughout: 21-25 tok/s).

So the CLI builds the model and the engine inside `off_the_main_thread`: a thread that does
the work and exits, taking its OpenMP team with it.
"""
from __future__ import annotations

import threading


def off_the_main_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) on a fresh thread; its result, or its exception raised here."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised on the caller's thread, with its traceback
            result["error"] = e

    thread = threading.Thread(target=target, name="model-loader")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
