"""``sampling_mode='auto'``: full where a full T-CSR's peak fits the memory budget, else partitioned."""
from tgl_dist.graph.tcsr import FULL_PEAK_BYTES_PER_EVENT, available_memory, choose_mode


def test_one_process_is_full_whatever_the_size():
    assert choose_mode(10 ** 12, 1)[0] == "full"


def test_full_only_where_the_peak_fits_the_budget():
    need = FULL_PEAK_BYTES_PER_EVENT * 10 ** 6
    mode, why = choose_mode(10 ** 6, 4, budget=need * 1.01)
    assert mode == "full" and "fits" in why
    mode, why = choose_mode(10 ** 6, 4, budget=need * 0.99)
    assert mode == "partitioned" and "exceeds" in why


def test_default_budget_is_a_quarter_of_available_memory_over_the_ranks_here(monkeypatch):
    avail = available_memory()
    assert avail > 0
    fits = int(avail / 4 / 2 / FULL_PEAK_BYTES_PER_EVENT * 0.5)   # half the budget of 2 ranks
    assert choose_mode(fits, 2, ranks_here=2)[0] == "full"
    assert choose_mode(fits * 4, 2, ranks_here=2)[0] == "partitioned"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")   # 16 ranks on this machine: 1/8 the budget
    assert choose_mode(fits, 16)[0] == "partitioned"
