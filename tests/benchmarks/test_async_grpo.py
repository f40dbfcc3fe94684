"""The asynchronous GRPO benchmark's bookkeeping: turns alternate, means and ratio are right."""

from __future__ import annotations

import pytest


def test_modes_take_turns_and_the_table_gives_the_async_over_sync_ratio():
    from benchmarks.async_grpo import format_table, summarize, turns

    def fake_run(mode: str, seconds: float) -> dict[str, float]:
        ipm = {"sync": 30.0, "async": 45.0}[mode]
        return {"iterations": int(ipm * seconds / 60), "seconds": seconds, "iters_per_min": ipm,
                "reward_end": 0.5, "learner_idle_frac": 0.6 if mode == "sync" else 0.3,
                "sampler_idle_frac": 0.5}

    rows = turns(2, 60.0, run=fake_run)
    assert [(r["round"], r["mode"]) for r in rows] == [
        (0, "sync"), (0, "async"), (1, "async"), (1, "sync")]
    means = summarize(rows)
    assert means["ratio"]["iters_per_min"] == pytest.approx(1.5)
    assert means["ratio"]["learner_idle_frac"] == pytest.approx(0.5)
    table = format_table(rows, 60.0)
    assert "| **mean** | **ratio** | 1.50x | 1.50x | 1.00x | 0.50x | 1.00x |" in table


def test_the_curve_table_has_one_row_per_window_and_one_column_per_mode():
    from benchmarks.async_grpo import format_curve

    table = format_curve({"sync": [0.25, 0.5], "async": [0.125]}, window=20).splitlines()
    assert table[0] == "| iterations | sync | async |"
    assert table[2:] == ["| 1-20 | 0.250 | 0.125 |", "| 21-40 | 0.500 |  |"]
