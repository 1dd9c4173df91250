"""The sinks' relay: views' change streams published to Kafka topics (`CREATE SINK`, docs/results.md "Sinks").

- service: the loop, one page per sink: read, produce, wait for the acknowledgements, advance (fenced);
- records: each change as a Kafka key and value, built by PostgreSQL, per the sink's format and filter;
- publish: the idempotent producer, delivery reports, dead letters.

Run it with `python -m pipelines.cv.relay` (the `sinks` service of the stack).
"""
