"""A minute -> hour -> day chain of views over views: its ingest cost and its latency (`python -m loadgen.rollup`)."""
