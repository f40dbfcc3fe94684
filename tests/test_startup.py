"""The start-up breakdown: parts add up to the whole, nested parts count once, parallel
parts' overlap goes to one."""

from __future__ import annotations

import time

import pytest

from rllib_grpo import startup
from rllib_grpo.startup import (
    STARTUP_PARTS,
    record_part,
    startup_breakdown,
    startup_part,
    startup_summary,
)


def test_parts_add_up_to_the_whole_and_a_nested_part_counts_once():
    # algorithm 10-20 holds engine 11-14 and learner 15-19; ray 2-5; nothing else covered.
    intervals = [("ray", 2.0, 5.0), ("algorithm", 10.0, 20.0), ("engine", 11.0, 14.0),
                 ("learner", 15.0, 19.0)]
    parts = startup_breakdown(0.0, 21.0, intervals)
    assert list(parts) == list(STARTUP_PARTS)
    assert parts == {"ray": 3.0, "model": 0.0, "engine": 3.0, "learner": 4.0,
                     "algorithm": 3.0, "other": 8.0}
    assert sum(parts.values()) == 21.0


def test_parallel_parts_overlap_goes_to_the_one_started_last_and_clipping_to_the_window():
    # engine 1-9 in a thread while ray runs 0.5-4 in the main thread; model 8-12 runs past
    # the end (10); an interval from a previous algorithm (-5..-1) is outside the window.
    intervals = [("ray", 0.5, 4.0), ("engine", 1.0, 9.0), ("model", 8.0, 12.0),
                 ("learner", -5.0, -1.0)]
    parts = startup_breakdown(0.0, 10.0, intervals)
    assert parts["ray"] == 0.5 and parts["engine"] == 7.0 and parts["model"] == 2.0
    assert parts["other"] == 0.5 and parts["learner"] == 0.0
    assert sum(parts.values()) == 10.0


def test_recorded_parts_and_their_names_are_checked(monkeypatch):
    monkeypatch.setattr(startup, "_intervals", [])
    with startup_part("engine"):
        time.sleep(0.01)
    with pytest.raises(ValueError, match="start-up part 'vllm'"):
        record_part("vllm", 0.0, 1.0)
    with pytest.raises(ValueError, match="start-up part 'other'"):  # never recorded: the rest
        record_part("other", 0.0, 1.0)
    [(part, start, end)] = startup.recorded_parts()
    assert part == "engine" and end - start >= 0.01
    parts = startup_breakdown(start - 1.0, end + 1.0)
    assert parts["engine"] == pytest.approx(end - start, abs=1e-9)
    assert sum(parts.values()) == pytest.approx(end - start + 2.0, abs=1e-9)


def test_summary_names_the_parts_in_order_and_leaves_out_the_empty_ones():
    parts = dict.fromkeys(STARTUP_PARTS, 0.0) | {"ray": 2.1, "engine": 5.0, "other": 1.24}
    assert startup_summary(8.34, parts) == "8.3s (ray 2.1, engine 5.0, other 1.2)"

