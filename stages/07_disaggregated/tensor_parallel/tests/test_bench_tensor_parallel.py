"""The benchmark runs end to end (quick mode, tiny model, two ranks) and writes its JSON through the
harness. It checks what does not depend on timing: the collectives a step makes, the bytes each
rank holds, the computed rows; never a speed."""
import json

import pytest

from course.s07_disaggregated.tensor_parallel.bench_tensor_parallel import main
from course.s07_disaggregated.tensor_parallel.testing import TP_TINY, save_tp_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    return save_tp_tiny(byte_tok, tmp_path_factory.mktemp("tp_bench"))


def test_bench_quick_counts_the_collectives_and_the_bytes(folder, tmp_path, capsys):
    out = tmp_path / "tp.json"
    r = main(["--model", str(folder), "--quick", "--threads", "2", "--json", str(out)])
    assert {"command", "machine"} <= set(json.loads(out.read_text()))
    assert r["tp"] == 2 and r["threads_per_rank"] == 1
    tp1, ranks = r["memory"]["tp1"], r["memory"]["tp2"]
    assert [x["name"] for x in ranks] == ["rank=0", "rank=1"]  # the README's figures pick a rank by name
    assert all(x["kv_bytes"] * 2 == tp1["kv_bytes"] and x["weight_bytes"] < 0.55 * tp1["weight_bytes"] for x in ranks)
    for batch, row in r["batches"].items():
        assert row["tp2"]["collectives_per_step"] == {"all_reduce": 2 * TP_TINY.num_hidden_layers + 1, "all_gather": 1}
        hidden_bytes = int(batch) * TP_TINY.hidden_size * 4
        assert row["tp2"]["bytes_per_step"] == (2 * TP_TINY.num_hidden_layers + 1) * hidden_bytes + int(batch) * 130 * 4
        assert row["computed"]["nvlink4"]["collective_s"] < row["computed"]["pcie4_x16"]["collective_s"]
    assert "DP/TP" in capsys.readouterr().out
