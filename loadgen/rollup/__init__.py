"""A minute -> hour -> day chain of views over views.

`python -m loadgen.rollup`: its ingest cost and its latency; `python -m loadgen.rollup.floor`: its
PostgreSQL cost as feeds, against the floor of applying it in the batch.
"""
