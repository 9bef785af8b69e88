"""The memory simulation on cases small enough to count by hand, and its accounting checked
against plain arithmetic on random cases."""
import math

from hypothesis import given
from hypothesis import strategies as st

from course.s03_paged.memory_sim import simulate


def test_memory_sim_max_length_reservations_do_not_fit_where_blocks_do():
    # 4 blocks of 16. Contiguous: each request reserves 10 + 1024 slots > 64: none fits.
    # Paged: 15 tokens -> 1 block, then 50 tokens -> 4 blocks, 5 > 4: only the first fits.
    r = simulate([(10, 5), (20, 30)], budget_tokens=64, block_size=16, max_new_tokens=1024)
    assert r["contiguous"] == {"admitted": 0, "reserved_slots": 0, "used_slots": 0,
                               "utilization": r["contiguous"]["utilization"]}
    assert math.isnan(r["contiguous"]["utilization"])
    assert r["paged"] == {"admitted": 1, "reserved_slots": 16, "used_slots": 15, "utilization": 15 / 16,
                          "blocks": 1}
    assert r["ratio"] == math.inf


def test_memory_sim_small_cap():
    # Contiguous: 10 + 32 = 42 fits, 20 + 32 = 52 more does not (94 > 64). Paged as above.
    r = simulate([(10, 5), (20, 30)], budget_tokens=64, block_size=16, max_new_tokens=32)
    assert (r["contiguous"]["admitted"], r["contiguous"]["reserved_slots"]) == (1, 42)
    assert r["contiguous"]["utilization"] == 15 / 42
    assert r["paged"]["admitted"] == 1 and r["ratio"] == 1.0


def test_memory_sim_paging_fits_twice_as_many():
    # 8 blocks of 16, cap 32. Contiguous: 42 + 52 = 94, + 48 = 142 > 128: two requests.
    # Paged: 15 -> 1 block, 50 -> 4, 32 -> 2, 1 -> 1: 8 blocks, all four requests.
    lengths = [(10, 5), (20, 30), (16, 16), (1, 0)]
    r = simulate(lengths, budget_tokens=128, block_size=16, max_new_tokens=32)
    assert r["contiguous"] == {"admitted": 2, "reserved_slots": 94, "used_slots": 65, "utilization": 65 / 94}
    assert r["paged"] == {"admitted": 4, "reserved_slots": 128, "used_slots": 98, "utilization": 98 / 128,
                          "blocks": 8}
    assert r["ratio"] == 2.0


def test_memory_sim_answers_stop_at_the_cap_and_admission_is_first_come_first_served():
    # The 2000-token answer is cut at 32 tokens: 10 + 32 = 42 -> 3 blocks of 16 in both layouts.
    r = simulate([(10, 2000)], budget_tokens=48, block_size=16, max_new_tokens=32)
    assert r["contiguous"]["used_slots"] == r["paged"]["used_slots"] == 42
    assert r["paged"]["blocks"] == 3
    # A request that does not fit blocks the small ones behind it.
    r = simulate([(100, 0), (1, 1)], budget_tokens=64, block_size=16, max_new_tokens=8)
    assert r["contiguous"]["admitted"] == r["paged"]["admitted"] == 0


@given(lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 300)), max_size=30),
       budget=st.integers(16, 4000), block_size=st.sampled_from([1, 4, 16]), cap=st.integers(1, 256))
def test_memory_sim_block_manager_agrees_with_arithmetic(lengths, budget, block_size, cap):
    r = simulate(lengths, budget, block_size, cap)
    blocks, admitted = 0, 0
    for p, o in lengths:
        need = math.ceil((p + min(o, cap)) / block_size)
        if blocks + need > budget // block_size:
            break
        blocks, admitted = blocks + need, admitted + 1
    assert (r["paged"]["admitted"], r["paged"]["blocks"]) == (admitted, blocks)
    assert r["paged"]["reserved_slots"] - r["paged"]["used_slots"] < block_size * max(admitted, 1)
    assert r["contiguous"]["reserved_slots"] <= budget
    assert r["contiguous"]["used_slots"] <= r["contiguous"]["reserved_slots"]
