"""Benchmarks: one harness, one module per suite (``python -m benchmarks --list``).

``python -m benchmarks <suite> [options]`` runs a suite, writes ``benchmarks/results/<suite>.json``
and regenerates ``benchmarks/README.md`` (`benchmarks.harness`).
"""
