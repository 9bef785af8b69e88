import pytest

from course.final.testing import live_server, tiny_engine


@pytest.fixture(scope="module")
def server(byte_tok):
    """(base URL, AsyncEngine) of a live tiny server with every room plugged in."""
    engine = tiny_engine(byte_tok, num_blocks=160)  # room for a prompt with tools (byte tokens)
    with live_server(engine, byte_tok) as url:
        yield url, engine
