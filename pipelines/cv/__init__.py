"""The continuous-view engine: streams and views declared in SQL, maintained in batches.

Each layer imports only from the layers below it (checked by `lint-imports`, see pyproject.toml):

- cli, status, cli_common: the `streamviews` command;
- runner, sink, isolation: the stream runner (Kafka in, batches applied, failures isolated);
- engine: a batch applied to a stream's state and views;
- catalog: the definitions stored in PostgreSQL, their locks, one handler per statement kind;
- views: a view compiled into its storage, maintenance and read SQL;
- frontend: statements read into the model against an explicit scope (no database access);
- decoding: a stream's records decoded (a CREATE STREAM is checked by compiling its decoder);
- sqltext: SQL text and pglast helpers, column types, array literals;
- model: the dataclasses every layer shares.
"""
