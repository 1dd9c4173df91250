"""Audit retention: drop the tables of days past retention, then delete their Elasticsearch indices.

Run: `python -m pipelines.audit.retention [--days N]` (as sv_indexer, like the puller), or let the puller
service do it every AUDIT_RETENTION_INTERVAL_S. Rows younger than N days are kept: tables of days
before (today - N) in UTC are dropped, which matches the writer refusing events older than N days.

PostgreSQL is the source of truth, so it goes first: `audit.drop_expired` drops the tables and queues
their days in `audit.index_deletions` in one transaction; the indices are deleted after, and a day
leaves the queue only once its index is gone. A crash in between leaves the day queued, and the next
run finishes it. Runs hold the puller's pass lock, so no bulk request recreates an index being deleted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta

import psycopg
from elasticsearch import Elasticsearch

from pipelines.audit import elastic
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import AuditSettings, ElasticsearchSettings, PostgresSettings

log = get_logger("retention")


@contextmanager
def pass_lock(conn: psycopg.Connection, log_schema: str) -> Iterator[None]:
    """The lock a puller pass and a retention run take turns on (per audit log, session-level)."""
    conn.execute("SELECT pg_advisory_lock(hashtext('audit.pull'), hashtext(%s))", (log_schema,))
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(hashtext('audit.pull'), hashtext(%s))", (log_schema,))


def cutoff(days: int, today: date | None = None) -> date:
    """The first day kept: tables of earlier days are dropped."""
    return (today or datetime.now(UTC).date()) - timedelta(days=days)


def run(conn: psycopg.Connection, es: Elasticsearch, settings: AuditSettings, days: int) -> dict[str, list[str]]:
    """Apply retention to one audit log; returns the tables dropped and the indices deleted.

    `conn` must be in autocommit mode: each step commits on its own.
    """
    schema, keep_from = settings.schema_name, cutoff(days)
    with pass_lock(conn, schema):
        dropped = [r[0] for r in conn.execute("SELECT audit.drop_expired(%s, %s)", (schema, keep_from))]
        queued = [r[0] for r in conn.execute("SELECT day FROM audit.index_deletions WHERE log_schema = %s", (schema,))]
        deleted = []
        for day in sorted(queued):
            index = elastic.index_name(settings.index_prefix, day)
            es.indices.delete(index=index, ignore_unavailable=True)
            conn.execute("DELETE FROM audit.index_deletions WHERE log_schema = %s AND day = %s", (schema, day))
            deleted.append(index)
    if dropped or deleted:
        log.info("retention", schema=schema, kept_from=str(keep_from), tables_dropped=dropped, indices_deleted=deleted)
    return {"tables_dropped": dropped, "indices_deleted": deleted}


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m pipelines.audit.retention [--days N]`."""
    settings = AuditSettings()
    parser = argparse.ArgumentParser(prog="python -m pipelines.audit.retention", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--days",
        type=int,
        default=settings.retention_days,
        help=f"days kept (default AUDIT_RETENTION_DAYS={settings.retention_days})",
    )
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days must be at least 1")
    configure_logging()
    postgres, es_settings = PostgresSettings(), ElasticsearchSettings()
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn, elastic.client(es_settings) as es:
        result = run(conn, es, settings, args.days)
    for table in result["tables_dropped"]:
        print(f"dropped table {table}")
    for index in result["indices_deleted"]:
        print(f"deleted index {index}")
    if not any(result.values()):
        print(f"nothing older than {cutoff(args.days)} in schema {settings.schema_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
