"""The event generators: what the benchmarks (and `make demo`) feed to Kafka, COPY or pgbench.

- `social`: the seed's likes (a Gaussian hot spot) and follows (a long tail), deterministic for a seed;
- `pageviews`: page views (url, uid, latency);
- `audit`: audit events with 512-character texts, as in the seed;
- `cdc`: likes written as rows of `app.likes`, for Debezium to capture.
"""
