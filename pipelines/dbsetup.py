"""Database setup: roles with least privilege, the database, extensions, then numbered migrations.

Run by `python -m stack up` for the local stack and as the `dbsetup` one-shot service in
docker-compose.yml; every step is idempotent, so it runs on each start.

1. As the superuser: one login role per duty (owner, writer, reader, indexer, cdc), each with its
   password from `SECRETS_DIR` and its timeouts (`ROLE_TIMEOUTS`); two databases owned by `sv_owner`
   and closed to PUBLIC: the views' (`PGDATABASE`), which the CDC role may not connect to, and the
   captured application tables' (`APP_DATABASE`), the only one it may.
2. As the superuser, in the database: `sql/extensions.sql` (hll, rum, tdigest, TimescaleDB when
   offered; advisory locks for the working roles only), then `sql/guards.sql` (event triggers
   refusing plain DDL that would drop or rename part of a continuous view; the migrations below
   mark their transactions as the catalog's own DDL).
3. As `sv_owner`: each `sql/app_migrations/NNNN_*.sql` in APP_DATABASE, then each
   `sql/migrations/NNNN_*.sql` in the views' database, each not yet applied in its own transaction
   with its row in that database's `ops.schema_migrations`; an applied migration whose text changed
   is an error. Before migration 0012 drops the views' database's old `app` schema, its rows move
   to APP_DATABASE (pipelines/cdc/captured_tables.py). Then the audit log's retention
   (`AUDIT_RETENTION_DAYS`) into `audit.retention`.
4. As `sv_owner`: the streams and continuous views of `sql/views/*.sql` (an unchanged definition is
   left alone, a new view is backfilled), then `sql/functions/*.sql` (CREATE OR REPLACE).

Usage: `PGUSER=postgres python -m pipelines.dbsetup`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from pipelines.cdc.captured_tables import move_captured_tables
from pipelines.cdc.connectors import CONNECTORS_DIR
from pipelines.cv import catalog
from pipelines.cv.catalog import stream_inserts
from pipelines.cv.catalog.locks import mark_catalog_ddl
from pipelines.errors import DatabaseSetupError, StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import (
    APP_ROLES,
    ROLE_CDC,
    ROLE_OWNER,
    ROLE_READER,
    ROLE_TIMEOUTS,
    ROLE_WRITER,
    AuditSettings,
    PostgresSettings,
    secret_file_name,
)

log = get_logger("dbsetup")

SQL_DIR = Path(os.environ.get("SQL_DIR", Path(__file__).resolve().parents[1] / "sql"))
# Serialises concurrent runs (two containers starting at once); any constant unique to this project.
MIGRATION_LOCK = 0x5356_4D49  # "SVMI"


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: str
    name: str
    text: str

    @property
    def checksum(self) -> str:
        """Fingerprint of the text, to catch edits to an already applied migration."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def load_migrations(folder: Path = SQL_DIR / "migrations") -> list[Migration]:
    """Migrations in version order; file names are `NNNN_what_it_does.sql`."""
    migrations = []
    for path in sorted(folder.glob("*.sql")):
        version, _, name = path.stem.partition("_")
        if not version.isdigit() or not name:
            raise DatabaseSetupError(f"migrations: {path.name} is not named NNNN_description.sql")
        migrations.append(Migration(version, name, path.read_text()))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise DatabaseSetupError(f"migrations: duplicate version numbers in {versions}")
    return migrations


def setup_database(admin: PostgresSettings) -> None:
    """All three steps, connecting as `admin` (a superuser) and then as the owner role."""
    ensure_roles_and_database(admin)
    with psycopg.connect(admin.conninfo(), autocommit=True) as conn:
        conn.execute((SQL_DIR / "extensions.sql").read_text())
        conn.execute((SQL_DIR / "guards.sql").read_text())
    with psycopg.connect(admin.conninfo(user=ROLE_OWNER, dbname=admin.app_database)) as conn:
        apply_migrations(conn, load_migrations(SQL_DIR / "app_migrations"))
    move_captured_tables(admin, CONNECTORS_DIR)
    with psycopg.connect(admin.conninfo(user=ROLE_OWNER)) as conn:
        apply_migrations(conn, load_migrations())
        # The retention the audit log keeps: audit.drop_expired never drops anything younger.
        audit = AuditSettings()
        conn.execute(
            "INSERT INTO audit.retention AS r (log_schema, days) VALUES (%s, %s) ON CONFLICT (log_schema)"
            " DO UPDATE SET days = excluded.days, updated_at = now() WHERE r.days <> excluded.days",
            (audit.schema_name, audit.retention_days),
        )
    with psycopg.connect(admin.conninfo(user=ROLE_OWNER), autocommit=True) as conn:
        with conn.transaction():  # `INSERT INTO <stream>` for streams declared before it existed (0030)
            mark_catalog_ddl(conn)  # sql/guards.sql refuses others' ALTER VIEW of a stream's insert relation
            stream_inserts.ensure_relations(conn, catalog.load_streams(conn, skip_broken=True).values())
        for path in sorted((SQL_DIR / "views").glob("*.sql")):
            catalog.define(conn, path.read_text())  # each file all or nothing
        for path in sorted((SQL_DIR / "functions").glob("*.sql")):
            with conn.transaction():
                conn.execute(path.read_text())


def ensure_roles_and_database(admin: PostgresSettings) -> None:
    """Create or update the roles and the database (superuser, outside any transaction)."""
    with psycopg.connect(admin.conninfo(dbname="postgres"), autocommit=True) as conn:
        for role in APP_ROLES:
            password = admin.role_password(role)
            if password is None:
                raise DatabaseSetupError(
                    f"roles: no password for {role}: set SECRETS_DIR to a folder with {secret_file_name(role)}"
                )
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            attributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE " + (
                "REPLICATION" if role == ROLE_CDC else "NOREPLICATION"
            )
            conn.execute(
                sql.SQL("{} ROLE {} " + attributes + " PASSWORD {}").format(
                    sql.SQL(verb), sql.Identifier(role), sql.Literal(password.get_secret_value())
                )
            )
            if not exists:
                log.info("created role", role=role)
        for role, (statement, idle) in ROLE_TIMEOUTS.items():
            for setting, value in (("statement_timeout", statement), ("idle_in_transaction_session_timeout", idle)):
                conn.execute(
                    sql.SQL("ALTER ROLE {} SET {} = {}").format(
                        sql.Identifier(role), sql.Identifier(setting), sql.Literal(value)
                    )
                )
        # The owner may see and signal the reader's sessions, for ops.stop_overrunning_reads (migration 0014).
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(ROLE_READER), sql.Identifier(ROLE_OWNER)))
        # Belt and braces for the query role: its sessions start read-only, on top of having no
        # write privileges anywhere.
        conn.execute(
            sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(sql.Identifier(ROLE_READER))
        )
        database, app_database = admin.database, admin.app_database
        if database == app_database:
            raise DatabaseSetupError(
                f"APP_DATABASE must differ from PGDATABASE ({database}): the CDC role may not see the views"
            )
        for name in (database, app_database):
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {} ENCODING 'UTF8'").format(
                        sql.Identifier(name), sql.Identifier(ROLE_OWNER)
                    )
                )
                log.info("created database", database=name)
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
        # CONNECT is what keeps the CDC role's REPLICATION to the captured tables: a walsender, like
        # any session, needs it to attach to a database and create or read a logical slot there.
        views_roles = [role for role in APP_ROLES if role != ROLE_CDC]
        conn.execute(
            sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(sql.Identifier(database), sql.Identifier(ROLE_CDC))
        )
        for name, roles in ((database, views_roles), (app_database, [ROLE_OWNER, ROLE_WRITER, ROLE_CDC])):
            conn.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                    sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, roles))
                )
            )
        # The owner creates the schemas (migrations); the pipelines stage each batch in temporary tables.
        conn.execute(
            sql.SQL("GRANT CREATE, TEMPORARY ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(ROLE_OWNER)
            )
        )
        conn.execute(
            sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(ROLE_WRITER)
            )
        )


def apply_migrations(conn: psycopg.Connection, migrations: list[Migration]) -> list[str]:
    """Apply what is new, one transaction each; returns the versions applied."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS ops")
        conn.execute(
            """
            CREATE TABLE IF NOT EXISTS ops.schema_migrations (
                version    text PRIMARY KEY,
                name       text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """
        )
    applied_now = []
    for migration in migrations:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            row = conn.execute(
                "SELECT checksum FROM ops.schema_migrations WHERE version = %s", (migration.version,)
            ).fetchone()
            if row is not None:
                if row[0] != migration.checksum:
                    raise DatabaseSetupError(
                        f"migrations: {migration.version}_{migration.name} was edited after it was applied; "
                        "add a new migration instead"
                    )
                continue
            try:  # the catalog's own DDL: sql/guards.sql lets it drop and rename read views and storage
                mark_catalog_ddl(conn)
                conn.execute(migration.text)
            except psycopg.Error as e:
                raise DatabaseSetupError(f"migrations: {migration.version}_{migration.name} failed: {e}") from e
            conn.execute(
                "INSERT INTO ops.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            log.info("applied migration", version=migration.version, name=migration.name)
            applied_now.append(migration.version)
    return applied_now


def main() -> int:
    """Entry point of `python -m pipelines.dbsetup`."""
    configure_logging()
    admin = PostgresSettings()
    log.info("database setup", **admin.describe())
    try:
        setup_database(admin)
    except (StreamviewsError, psycopg.Error) as e:
        log.error("database setup failed", error=str(e))
        return 1
    log.info("database ready", database=admin.database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
