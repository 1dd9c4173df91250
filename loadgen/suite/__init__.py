"""`make bench`: every benchmark in turn, then BENCHMARKS.md and its plots (`python -m loadgen.suite`)."""
