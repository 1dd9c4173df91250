"""Shared plumbing of the benchmarks: one error, one output protocol, and the steps every benchmark takes.

- `errors`: `BenchmarkError`, the one error class;
- `report`: the output protocol (`Results` -> `BenchResult`: printed report, one JSON line), the machine line;
- `cli`: the command line every benchmark shares (`--json`, `--progress`) and the one way to run it;
- `kafka`: producing (`Sender`, `EventSource`) and the bare consumer (the Kafka ceiling);
- `postgres`: the owner connection, throwaway schemas, pgbench, the server's settings;
- `throwaway`: throwaway names, definitions, topics and consumer groups, dropped at the end;
- `social_copies`: copies of the social streams, views and functions in a throwaway schema, filled
  through the engine for the query benchmarks;
- `seed`: the seed's own approaches (per-event function, array intersection, PK read, raw COPY);
- `processes`: stream runners and services as child processes, their PostgreSQL backends;
- `drain`: timing a pipeline's drain of a backlog, and the CPU used along the way;
- `freshness`: marker events under a steady load, timed until visible.
"""
