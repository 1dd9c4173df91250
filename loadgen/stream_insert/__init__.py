"""Writing a stream with SQL (INSERT, COPY) beside producing to Kafka: `python -m loadgen.stream_insert`."""
