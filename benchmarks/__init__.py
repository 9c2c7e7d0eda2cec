"""The benchmarks: each module is a script (`python3 benchmarks/<name>.py --help`); tests import
what they share from here (`benchmarks.suite_throughput`). Results: `benchmarks/results/` and
docs/PERFORMANCE.md."""
