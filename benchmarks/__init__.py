"""Benchmarks: where a GRPO iteration's time goes, and how it compares with a plain loop.

``python -m benchmarks.harness --help`` (or ``make bench``); see ``benchmarks/README.md``.
"""
