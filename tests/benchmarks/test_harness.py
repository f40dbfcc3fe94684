"""The harness: one results file per registered suite, and benchmarks/README.md generated
from them (the machine once, per suite its commands and table, under 150 lines)."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness import (
    README,
    RESULTS_DIR,
    SUITES,
    load_results,
    markdown_table,
    render_readme,
    rounded,
    suite_module,
    write_results,
)

MACHINE = {"cpu": "Some CPU", "cores": 2, "memory_gib": 24, "gpu": "none", "torch": "2.13"}

# The harness builds the algorithm: a Ray of its own.
pytestmark = pytest.mark.ray


def results_of(suite: str, machine: dict | None = None) -> dict:
    return {"suite": suite, "title": f"{suite} title", "description": f"What {suite} measures.",
            "commands": [f"python -m benchmarks {suite} --x 1"], "machine": machine or MACHINE,
            "rows": [{"name": "a", "seconds": 1.23456, "ratio": 0.5}]}


def test_the_committed_readme_is_generated_from_the_committed_results():
    assert README.read_text() == render_readme(load_results())


def test_the_results_folder_holds_one_small_file_per_suite_and_no_machine_paths():
    files = sorted(p.name for p in RESULTS_DIR.iterdir())
    assert files == sorted(f"{name}.json" for name in SUITES)
    for path in RESULTS_DIR.iterdir():
        text = path.read_text()
        assert "/root/" not in text and "/tmp/" not in text and "/home/" not in text, path
        results = json.loads(text)
        assert results["suite"] == path.stem and results["rows"], path
        assert all(c.startswith(f"python -m benchmarks {path.stem}") for c in results["commands"])
        assert len(text) < 20_000, path


def test_every_suite_module_has_a_title_a_description_and_a_run():
    for name in SUITES:
        module = suite_module(name)
        assert module.TITLE and module.DESCRIPTION.strip() and callable(module.run), name


def test_an_unknown_suite_is_refused_with_the_names_of_the_suites():
    with pytest.raises(SystemExit, match="unknown suite 'stepp': choose one of step, learner"):
        suite_module("stepp")


def test_the_readme_gives_the_common_machine_once_and_names_another_one_where_it_differs():
    gpu = {**MACHINE, "gpu": "NVIDIA H100"}
    text = render_readme([results_of("step"), results_of("learner"), results_of("trl", gpu)])
    assert text.count("Some CPU, 2 cores, 24 GiB, GPU: none; torch 2.13") == 1
    assert "Machine: Some CPU, 2 cores, 24 GiB, GPU: NVIDIA H100; torch 2.13." in text
    trl = text.index("## trl: trl title")
    assert text.index("GPU: NVIDIA H100") > trl
    assert text.index("python -m benchmarks trl --x 1") > trl
    assert "| name | seconds | ratio |\n|---|---:|---:|\n| a | 1.23 | 0.5 |" in text


def test_a_readme_over_the_line_limit_is_refused():
    many = results_of("step")
    many["rows"] = [{"name": str(i)} for i in range(150)]
    with pytest.raises(ValueError, match="lines \\(limit 150\\)"):
        render_readme([many])


def test_table_columns_are_the_union_of_the_rows_keys_and_cells_are_formatted():
    lines = markdown_table([{"a": 1, "b": "x"}, {"a": 2.5, "c": True, "d": 12345.6}])
    assert lines[0] == "| a | b | c | d |"
    assert lines[1] == "|---:|---|---|---:|"  # a missing cell does not make a column text
    assert lines[2:] == ["| 1 | x |  |  |", "| 2.5 |  | yes | 12346 |"]


def test_results_are_written_per_suite_with_floats_to_four_digits(tmp_path):
    path = write_results(results_of("rewards"), tmp_path)
    assert path == tmp_path / "rewards.json"
    assert json.loads(path.read_text())["rows"][0]["seconds"] == 1.235
    assert rounded({"a": [0.000123456, 7], "b": "s"}) == {"a": [0.0001235, 7], "b": "s"}
    assert [r["suite"] for r in load_results(tmp_path)] == ["rewards"]
