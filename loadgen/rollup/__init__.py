"""A minute -> hour -> day chain of views over views.

`python -m loadgen.rollup`: its ingest cost and its latency; `python -m loadgen.rollup.floor`: its
PostgreSQL cost as feeds, against two emulated designs (the levels in the batch; feeds of typed deltas).
"""
