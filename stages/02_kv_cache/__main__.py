import sys

from course.s01_decode_loop.cli import main

from .generate import stream_cached

sys.exit(main(stream_fn=stream_cached, description="Stage 02: prefill once, then decode with a KV cache."))
