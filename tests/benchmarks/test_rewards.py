"""The rewards suite's rows: samples/s each way and the ratios between them."""

from __future__ import annotations


def test_a_row_gives_the_ratios_of_the_three_ways():
    from benchmarks.rewards import measurement_row

    row = measurement_row({"model": "256x4", "samples": 256, "parameters": 3_808_256,
                           "one_at_a_time": 100.0, "batched": 600.0, "actor_pool": 300.0,
                           "actor_calls": 4})
    assert row["params (M)"] == 3.808
    assert row["batched / one at a time"] == 6.0
    assert row["actor pool / batched"] == 0.5
