import openai
import pytest

from course.s01_decode_loop.testing import byte_tokenizer
from course.final.cli import assemble_app
from course.final.testing import CHAT_TEMPLATE, running_server, tiny_engine

STORE_SIZE = 4  # small, so that a test can see a response evicted
# The byte tokenizer spends a token per character, so this template takes the tools (as templates
# that know tools do) but writes only how many there are: prompts stay short and countable.
TOOLS_TEMPLATE = "{% if tools %}({{ tools | length }} tools)\n{% endif %}" + CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()  # its own: the template below is set on it


@pytest.fixture(scope="module")
def server(tok):
    """(base URL, AsyncEngine) of a live tiny server with every room plugged in."""
    engine = tiny_engine(tok, num_blocks=512)
    tok.chat_template = TOOLS_TEMPLATE
    app = assemble_app(engine, tok, "tiny", responses_store_size=STORE_SIZE)
    with running_server(engine, tok, app=app) as (url, _):
        yield url, engine


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)
