"""``python -m benchmarks <suite> [options]``: run one suite, record it, regenerate the README.

    python -m benchmarks --list              # the suites
    python -m benchmarks step --help         # a suite's options
    python -m benchmarks readme              # benchmarks/README.md from the results files
"""

from __future__ import annotations

import sys

from benchmarks.harness import README, SUITES, load_results, render_readme, run_suite, suite_module


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "--list"):
        print(__doc__)
        for name in SUITES:
            print(f"  {name:<14} {suite_module(name).TITLE}")
        return 0
    if args[0] == "readme":
        README.write_text(render_readme(load_results()))
        print(f"wrote {README}")
        return 0
    results = run_suite(args[0], args[1:])
    print(f"wrote benchmarks/results/{args[0]}.json ({len(results['rows'])} rows) and {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
