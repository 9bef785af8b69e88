"""A rank that dies: the step fails at once with a clear error, the group stays broken, and no
process is left; a clean close stops every rank."""
import os
import signal
import time

import pytest

from course.s01_decode_loop.sampling import SamplingParams
from course.s07_disaggregated.tensor_parallel.comm import TensorParallelError
from course.s07_disaggregated.tensor_parallel.launch import TensorParallel, TPSpec
from course.s07_disaggregated.tensor_parallel.testing import save_tp_tiny, tp_engine
from course.s07_disaggregated.testing import alive


@pytest.fixture(scope="module")
def folder(tmp_path_factory, byte_tok):
    return save_tp_tiny(byte_tok, tmp_path_factory.mktemp("tp_tiny"))


def test_a_killed_rank_fails_the_step_at_once_and_leaves_no_process(folder):
    failures = []
    tp = TensorParallel.start(TPSpec(2, str(folder), timeout_s=30, threads=1), on_failure=failures.append)
    try:
        loaded, model = tp.load_shard()
        engine = tp_engine(tp, loaded, model)
        engine.add_request(list(range(40, 50)), SamplingParams(max_new_tokens=200, temperature=0, ignore_eos=True))
        engine.step()
        os.kill(tp.processes[0].pid, signal.SIGKILL)
        with pytest.raises(TensorParallelError, match="tensor parallel group failed"):
            for _ in range(200):
                engine.step()
        with pytest.raises(TensorParallelError):  # broken for good: no step waits on a dead peer
            engine.step()
        deadline = time.monotonic() + 60  # a bound for a loaded machine; it returns as soon as told
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(failures) == 1
    finally:
        tp.close()
    assert not any(alive(p.pid) for p in tp.processes)


def test_closing_rank_0_stops_the_others(folder):
    tp = TensorParallel.start(TPSpec(2, str(folder), timeout_s=30, threads=1))
    tp.load_shard()
    pid = tp.processes[0].pid
    tp.close()
    assert tp.processes[0].exitcode == 0 and not alive(pid)


def test_an_idle_group_outlives_its_timeout(folder):
    """Rank 0's heartbeat keeps the followers' wait for the next step inside the collective timeout
    (without it, this test fails: rank 1's wait times out). The short timeout holds from the
    attach on; loading the shards had the startup timeout, however slow a busy machine is."""
    with TensorParallel.start(TPSpec(2, str(folder), timeout_s=5, threads=1)) as tp:
        loaded, model = tp.load_shard()
        engine = tp_engine(tp, loaded, model)
        time.sleep(11)  # idle for more than twice the step timeout
        out = engine.generate([list(range(40, 50))], SamplingParams(max_new_tokens=4, temperature=0))
        assert len(out[0].token_ids) == 4 and tp.leader.broken is None
