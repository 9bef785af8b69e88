import sys

from course.s01_decode_loop.cli import main

from .engine import PagedGenerator


def add_args(parser):
    g = parser.add_argument_group("paged KV cache")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-blocks", type=int, default=256, help="blocks in the pool (default 256)")
    g.add_argument("--no-prefix-caching", action="store_true")


def make_stream(loaded, args):
    return PagedGenerator(loaded.model, num_blocks=args.kv_blocks, block_size=args.block_size,
                          enable_prefix_caching=not args.no_prefix_caching)


sys.exit(main(description="Stage 03: a paged KV cache with prefix caching.", make_stream=make_stream,
              add_args=add_args))
