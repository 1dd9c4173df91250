"""Moving the captured application tables out of the views' database, once, without losing a change.

Until migration 0012 the tables Debezium captures (app.likes, app.follows) lived in the views'
database, and so did the connector's replication slot. They now live in APP_DATABASE, the only
database the CDC role may connect to. On a database set up before that, dbsetup calls
`move_captured_tables` before migration 0012 drops the old schema:

1. Each old slot named in connectors/*.json must be inactive (Kafka Connect stopped), and must hold
   no change of a captured table that Debezium has not confirmed: those would otherwise never reach
   the streams. Either case stops the set-up with a one-line error saying what to do.
2. The rows are copied into APP_DATABASE's tables (rows already there are kept).
3. The old slots are dropped, so they retain no WAL.

The connector, applied next with APP_DATABASE as its database, creates its slot there, after the
copy: the copied rows are not captured again (the streams have them already), and every later change
is. Its stored Kafka Connect offset points at older WAL, which a new slot simply starts past.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql

from pipelines.errors import DatabaseSetupError
from pipelines.logs import get_logger
from pipelines.settings import PostgresSettings

log = get_logger("dbsetup.captured_tables")

# (table, its columns): what the old schema held and the new one receives.
CAPTURED_TABLES = (("likes", ("oid", "uid", "created_at")), ("follows", ("uid", "target", "created_at")))

# Changes of the captured tables that a pgoutput slot still holds. A pgoutput (protocol 1) change
# message is a type byte ('I' 73, 'U' 85, 'D' 68) followed by the table's OID as a 4-byte integer.
PENDING_CHANGES = """
SELECT count(*)
  FROM pg_logical_slot_peek_binary_changes(%(slot)s, NULL, NULL,
                                           'proto_version', '1', 'publication_names', %(publication)s)
 WHERE get_byte(data, 0) IN (73, 85, 68)
   AND ('x' || encode(substring(data FROM 2 FOR 4), 'hex'))::bit(32)::int::oid = ANY (%(tables)s::oid[])
"""


def move_captured_tables(admin: PostgresSettings, connectors_dir: Path) -> int:
    """Copy app.* rows from the views' database to APP_DATABASE and drop the old slots; rows copied.

    Does nothing (returns 0) once the views' database has no `app.likes`: after the move, and on a
    database created after it. `admin` connects as a superuser (peeking at and dropping slots).
    """
    with psycopg.connect(admin.conninfo(), autocommit=True) as old:
        tables = old.execute(
            "SELECT array_agg(to_regclass('app.' || t)::oid) FROM unnest(%s::text[]) AS t",
            ([name for name, _ in CAPTURED_TABLES],),
        ).fetchone()[0]
        if None in tables:
            return 0
        slots = _old_slots(old, connectors_dir)
        for slot, publication, active in slots:
            if active:
                raise DatabaseSetupError(
                    f"captured tables: Debezium still reads slot {slot} in database {admin.database}; "
                    f"stop Kafka Connect (python -m stack stop connect), then run again to move app.* to "
                    f"{admin.app_database}"
                )
            pending = old.execute(
                PENDING_CHANGES, {"slot": slot, "publication": publication, "tables": tables}
            ).fetchone()[0]
            if pending:
                raise DatabaseSetupError(
                    f"captured tables: slot {slot} holds {pending} change(s) of app.likes/app.follows that "
                    "Debezium has not confirmed; start Kafka Connect, wait until `python -m "
                    "pipelines.cdc.connectors status` shows the slot 0 bytes behind, stop it, run again"
                )
        copied = _copy_rows(old, admin)
        for slot, _, _ in slots:
            old.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
        log.info(
            "captured tables moved",
            rows=copied,
            to_database=admin.app_database,
            dropped_slots=[slot for slot, _, _ in slots],
        )
        return copied


def _old_slots(old: psycopg.Connection, connectors_dir: Path) -> list[tuple[str, str, bool]]:
    """(slot, publication, active) of each connector's slot that exists in the views' database."""
    from pipelines.cdc.connectors import slot_names

    found = []
    for slot, publication in slot_names(connectors_dir):
        row = old.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s AND database = current_database()",
            (slot,),
        ).fetchone()
        if row is not None:
            found.append((slot, publication, row[0]))
    return found


def _copy_rows(old: psycopg.Connection, admin: PostgresSettings) -> int:
    """Stream each table's rows into APP_DATABASE in one transaction; rows already there win."""
    copied = 0
    with psycopg.connect(admin.conninfo(dbname=admin.app_database)) as new:
        for table, columns in CAPTURED_TABLES:
            column_list = sql.SQL(", ").join(map(sql.Identifier, columns))
            staging = sql.Identifier(f"moving_{table}")
            new.execute(
                sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM app.{} WITH NO DATA").format(
                    staging, column_list, sql.Identifier(table)
                )
            )
            source = sql.SQL("COPY (SELECT {} FROM app.{}) TO STDOUT (FORMAT binary)").format(
                column_list, sql.Identifier(table)
            )
            with (
                old.cursor().copy(source) as reading,
                new.cursor().copy(sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(staging)) as writing,
            ):
                for block in reading:
                    writing.write(block)
            cursor = new.execute(
                sql.SQL("INSERT INTO app.{} ({}) SELECT {} FROM {} ON CONFLICT DO NOTHING").format(
                    sql.Identifier(table), column_list, column_list, staging
                )
            )
            copied += cursor.rowcount
    return copied
