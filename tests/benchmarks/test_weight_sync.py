"""The weight-sync suite's bookkeeping: paths timed in rotating turns, ratios to the floors."""

from __future__ import annotations


def test_paths_are_timed_in_rotating_turns_after_a_warm_up_round():
    from benchmarks.weight_sync import _interleaved

    calls = []
    times = _interleaved({"a": lambda: calls.append("a") or 0.5,
                          "b": lambda: calls.append("b")}, reps=3)
    assert times["a"] == 0.5 and 0 <= times["b"] < 0.5  # a float return is the timing
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up round, then rotated


def test_a_shapes_row_has_each_paths_milliseconds_and_the_ratios_to_its_floor():
    from benchmarks.weight_sync import shape_row

    measured = {"local_sync_s": 2.0, "copy_in_place_s": 1.0, "shm_sync_s": 1.5,
                "object_store_sync_s": 10.0, "memcpy_s": 0.5, "shm_bytes": 2**20}
    row = shape_row("smollm2", "float32", measured)
    assert (row["MiB per sync"], row["shm ms"], row["memcpy ms"]) == (1, 1500.0, 500.0)
    assert row["local / copy_ in place"] == 2.0
    assert row["shm (auto) / memcpy"] == 3.0
    assert row["shm (auto) / object store"] == 0.15
