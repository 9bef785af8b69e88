"""The served-speculation benchmark runs the server's own engines, one request at a time, and
refuses a system that changes the greedy answers."""
import pytest

from course.final.bench.speculation import main
from course.final.testing import CHAT_TEMPLATE


@pytest.mark.slow
def test_every_system_answers_the_held_out_prompts_with_the_first_systems_tokens(tiny_folder, tmp_path, capsys):
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    model = f"--model {tiny_folder} --kv-memory 1MiB --chat-template {template}"
    result = main(["--prompts", "2", "--max-tokens", "8",
                   "--system", f"off|{model}",
                   "--system", f"lookup fixed|{model} --speculative-method lookup --speculative-policy fixed",
                   "--system", f"lookup cost|{model} --speculative-method lookup"])
    names = [r["name"] for r in result["rows"]]
    assert names == ["off", "lookup fixed", "lookup cost"]
    assert all(r["tokens"] == result["rows"][0]["tokens"] > 0 for r in result["rows"])
    assert result["rows"][1]["proposed"] > 0 and "draft_policy" in result["rows"][2]
    assert "tok/forward" in capsys.readouterr().out
