"""The learner suite's rows: medians per (variant, threads), CPU time over fp32's."""

from __future__ import annotations


def test_rows_give_medians_and_the_ratio_to_fp32_at_the_same_thread_count():
    from benchmarks.learner import variant_rows

    def result(variant: str, threads: int, cpu: list[float]) -> dict:
        return {"variant": variant, "threads": threads, "step_cpu_s": cpu, "step_s": [9.0],
                "ref_s": [1.0], "ref_cpu_s": [1.0], "peak_rss_mb": 100.0}

    rows = variant_rows([result("fp32", 1, [10.0, 30.0, 20.0]), result("bf16", 1, [5.0]),
                         result("bf16", 2, [4.0]),
                         {**result("compile", 1, [20.0]), "compile_s": [3.0, 5.0]}])
    assert rows[0]["step CPU s"] == 20.0 and rows[0]["step CPU / fp32"] == 1.0
    assert rows[1]["step CPU / fp32"] == 0.25
    assert rows[2]["step CPU / fp32"] is None  # no fp32 run at 2 threads
    assert rows[3]["compile s"] == 4.0 and "compile s" not in rows[0]
