"""The start-up suite's rows: medians of the runs of one (sampler, reward)."""

from __future__ import annotations


def test_a_row_is_the_median_of_its_runs():
    from benchmarks.startup import NUMBERS, median_row

    runs = [{key: float(i) for key in NUMBERS} for i in (3, 1, 2)]
    row = median_row("hf", "user", runs)
    assert (row["sampler"], row["reward"], row["runs"]) == ("hf", "user", 3)
    assert row["start -> first step s"] == 2.0 and row["tree PSS GB"] == 2.0
