"""PostgreSQL is the project's own cluster, configured for the workload and locked down.

Logical WAL, loopback only, SCRAM passwords, the extensions the schema needs, and roles that can do
their duty and nothing more.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg import errors

from pipelines.dbsetup import SQL_DIR, apply_migrations, load_migrations, setup_database
from pipelines.settings import ROLE_TIMEOUTS, PostgresSettings
from stack.configure import APP_DATABASE
from tests.integration.conftest import unique, wait_for


def test_the_cluster_is_configured_for_change_data_capture_on_loopback_only(pg):
    with pg("postgres") as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('wal_level', 'listen_addresses', 'password_encryption', 'server_version_num')"
            ).fetchall()
        )
    assert settings["wal_level"] == "logical"
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["password_encryption"] == "scram-sha-256"
    assert settings["server_version_num"].startswith("15")


def test_a_connection_without_the_password_is_refused(stack):
    conninfo = f"host=127.0.0.1 port={stack.pgport} dbname=streamviews user=sv_reader password=wrong"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(conninfo)


def test_hll_and_rum_are_installed_and_usable(pg):
    with pg("sv_owner") as conn:
        installed = {r[0] for r in conn.execute("SELECT extname FROM pg_extension")}
        estimate = conn.execute(
            "SELECT hll_cardinality(hll_add_agg(hll_hash_bigint(i))) FROM generate_series(1, 1000) i"
        ).fetchone()[0]
        conn.execute("CREATE TEMP TABLE docs (body tsvector)")
        conn.execute("CREATE INDEX ON docs USING rum (body rum_tsvector_ops)")
    assert {"hll", "rum"} <= installed
    assert 950 <= estimate <= 1050


@pytest.fixture
def owned_table(pg):
    """A table the owner created and granted as migrations do: reader may SELECT, writer may write."""
    schema = unique("it")
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.likes (oid bigint PRIMARY KEY, n bigint NOT NULL)")
        conn.execute(f"INSERT INTO {schema}.likes VALUES (1, 10)")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_reader, sv_writer")
        conn.execute(f"GRANT SELECT ON {schema}.likes TO sv_reader")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON {schema}.likes TO sv_writer")
    yield f"{schema}.likes"
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_the_read_only_role_reads_but_is_denied_every_write(pg, owned_table):
    with pg("sv_reader", autocommit=True) as conn:
        assert conn.execute(f"SELECT n FROM {owned_table} WHERE oid = 1").fetchone() == (10,)
        with pytest.raises(errors.ReadOnlySqlTransaction):
            conn.execute(f"INSERT INTO {owned_table} VALUES (2, 1)")
        # Even a session that switches read-only off has no privilege to write or create.
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f"UPDATE {owned_table} SET n = 0")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f"DELETE FROM {owned_table}")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.sneaky (x int)")


def test_the_writer_writes_data_and_offsets_but_cannot_change_the_schema(pg, owned_table):
    group = unique("group")
    with pg("sv_writer") as conn:
        conn.execute(f"UPDATE {owned_table} SET n = n + 1 WHERE oid = 1")
        conn.execute(
            "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset) VALUES (%s, 'likes', 0, 42)",
            (group,),
        )
        conn.commit()
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f"ALTER TABLE {owned_table} ADD COLUMN x int")
        conn.rollback()
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE ops.sneaky (x int)")
        conn.rollback()
    with pg("sv_owner") as conn:
        assert conn.execute(f"SELECT n FROM {owned_table}").fetchone() == (11,)
        conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))
        conn.commit()


def test_only_the_writer_reads_kafka_offsets(pg):
    for role in ("sv_reader", "sv_indexer"):
        with pg(role) as conn, pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM ops.kafka_offsets")


def test_no_role_may_stream_the_clusters_physical_wal(stack, secrets_dir):
    # Physical replication (pg_basebackup, a standby) would copy every database; pg_hba refuses it.
    password = (secrets_dir / "pg_cdc_password").read_text().strip()
    conninfo = f"host=127.0.0.1 port={stack.pgport} user=sv_cdc password={password} replication=true dbname=x"
    with pytest.raises(psycopg.OperationalError, match=r"pg_hba\.conf"):
        psycopg.connect(conninfo).close()


@pytest.mark.parametrize("replication", ["", " replication=database"])
@pytest.mark.parametrize("database", ["streamviews", "postgres", "template1"])
def test_the_cdc_role_cannot_attach_to_any_database_but_the_captured_tables(stack, secrets_dir, database, replication):
    # REPLICATION decodes every change of a database the role can attach to (a logical slot there
    # would show ops.kafka_offsets and the views' storage): pg_hba and CONNECT keep it out.
    password = (secrets_dir / "pg_cdc_password").read_text().strip()
    conninfo = f"host=127.0.0.1 port={stack.pgport} user=sv_cdc password={password} dbname={database}{replication}"
    with pytest.raises(psycopg.OperationalError, match=r"pg_hba\.conf|CONNECT privilege"):
        psycopg.connect(conninfo).close()


def test_the_cdc_role_lacks_connect_on_the_views_database_whatever_pg_hba_says(pg):
    # The production image keeps the official pg_hba.conf: the privilege is what holds there.
    with pg("postgres") as conn:
        assert conn.execute("SELECT has_database_privilege('sv_cdc', 'streamviews', 'CONNECT')").fetchone() == (False,)
        assert conn.execute("SELECT has_database_privilege('sv_cdc', %s, 'CONNECT')", (APP_DATABASE,)).fetchone() == (
            True,
        )


def test_the_captured_tables_and_their_slot_live_in_their_own_database(pg):
    with pg("postgres") as conn:
        slots = conn.execute(
            "SELECT slot_name, database FROM pg_replication_slots WHERE slot_type = 'logical'"
        ).fetchall()
    assert ("streamviews_app_social", APP_DATABASE) in slots
    assert not [slot for slot, database in slots if database == "streamviews"]
    with pg("sv_owner") as conn:
        assert conn.execute("SELECT to_regnamespace('app')").fetchone() == (None,)
    with pg("sv_writer", dbname=APP_DATABASE) as conn:
        assert conn.execute("SELECT count(*) >= 0 FROM app.likes").fetchone() == (True,)


def test_only_the_cdc_role_may_replicate(pg):
    with pg("postgres") as conn:
        rows = dict(conn.execute("SELECT rolname, rolreplication FROM pg_roles WHERE rolname LIKE 'sv\\_%'").fetchall())
    assert rows == {"sv_owner": False, "sv_writer": False, "sv_reader": False, "sv_indexer": False, "sv_cdc": True}


def test_only_the_roles_doing_the_work_can_take_advisory_locks(pg):
    # A reader holding the key the pipelines lock per batch would hold every batch. (The CDC role
    # cannot connect to this database at all.)
    with pg("sv_reader") as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("SELECT pg_advisory_xact_lock_shared(17222, hashtext('likes'))")


def test_every_role_has_a_statement_timeout_so_no_query_pins_a_core(pg):
    for role, (statement, idle) in ROLE_TIMEOUTS.items():
        with pg(role, dbname=APP_DATABASE if role == "sv_cdc" else "streamviews") as conn:
            shown = conn.execute(
                "SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()
            assert shown == (statement, idle), role


def test_database_setup_is_idempotent(stack, pg, secrets_dir):
    admin = PostgresSettings(host="127.0.0.1", port=stack.pgport, user="postgres", secrets_dir=secrets_dir)
    setup_database(admin)
    with pg("sv_owner") as conn:
        assert apply_migrations(conn, load_migrations()) == []
        applied = [r[0] for r in conn.execute("SELECT version FROM ops.schema_migrations ORDER BY version")]
    assert applied == [m.version for m in load_migrations()]
    with pg("sv_owner", dbname=APP_DATABASE) as conn:
        app_migrations = load_migrations(SQL_DIR / "app_migrations")
        assert apply_migrations(conn, app_migrations) == []


def stopped_by_watchdog(writer: psycopg.Connection, pid: int, *bounds: str) -> list[str]:
    """What ops.stop_overrunning_reads(*bounds) did to session `pid` (it may meet other tests' readers too)."""
    arguments = ", ".join(["%s::interval"] * len(bounds))
    rows = writer.execute(f"SELECT pid, action FROM ops.stop_overrunning_reads({arguments})", bounds).fetchall()
    return [action for stopped, action in rows if stopped == pid]


def read_in_a_thread(reader: psycopg.Connection, failures: list[BaseException]) -> threading.Thread:
    """`SELECT pg_sleep(600)` on `reader` in a thread, its error appended to `failures`."""

    def long_read() -> None:
        try:
            reader.execute("SELECT pg_sleep(600)")
        except psycopg.Error as e:
            failures.append(e)

    thread = threading.Thread(target=long_read, daemon=True)
    thread.start()
    return thread


def test_a_reader_that_lifts_its_statement_timeout_is_cancelled_by_the_watchdog(pg):
    """The role's 10 s is only a default; ops.stop_overrunning_reads (called by the runner) is the bound."""
    failures: list[BaseException] = []
    with pg("sv_reader", autocommit=True) as reader, pg("sv_writer", autocommit=True) as writer:
        reader.execute("SET statement_timeout = 0")
        thread = read_in_a_thread(reader, failures)
        stopped = wait_for(
            lambda: stopped_by_watchdog(writer, reader.info.backend_pid, "1 second"),
            timeout=30,
            what="the watchdog to meet the long read",
        )
        thread.join(30)
    assert stopped == ["cancelled"]
    assert [type(e) for e in failures] == [errors.QueryCanceled]


def test_a_reader_idle_in_a_transaction_past_the_bound_is_disconnected(pg):
    with pg("sv_reader") as reader:
        reader.execute("SET idle_in_transaction_session_timeout = 0")
        reader.execute("SELECT 1")  # the transaction stays open, holding its snapshot
        with pg("sv_writer", autocommit=True) as writer:
            stopped = wait_for(
                lambda: stopped_by_watchdog(writer, reader.info.backend_pid, "1 hour", "1 second"),
                timeout=30,
                what="the watchdog to meet the idle transaction",
            )
        assert stopped == ["terminated"]
        with pytest.raises(psycopg.OperationalError):
            reader.execute("SELECT 1")


def test_a_repeatable_read_reader_that_never_idles_long_is_ended_by_its_transactions_age(pg):
    """A snapshot held by a reader that runs `SELECT 1` now and then escapes the statement and idle bounds."""
    with pg("sv_reader") as reader, pg("sv_writer", autocommit=True) as writer:
        reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

        def keep_busy_then_watch() -> list[str]:
            reader.execute("SELECT 1")  # idle for moments only, and never a long statement
            return stopped_by_watchdog(writer, reader.info.backend_pid, "1 hour", "1 second", "2 seconds")

        stopped = wait_for(keep_busy_then_watch, timeout=30, what="the watchdog to meet the old transaction")
        assert stopped == ["terminated old transaction"]
        with pytest.raises(psycopg.OperationalError):
            reader.execute("SELECT 1")


def test_a_reader_transaction_past_the_bound_is_ended_while_a_statement_runs_in_it(pg):
    failures: list[BaseException] = []
    with pg("sv_reader") as reader, pg("sv_writer", autocommit=True) as writer:
        reader.execute("SET statement_timeout = 0")  # opens the transaction the read runs in
        thread = read_in_a_thread(reader, failures)
        stopped = wait_for(
            lambda: stopped_by_watchdog(writer, reader.info.backend_pid, "1 hour", "1 hour", "1 second"),
            timeout=30,
            what="the watchdog to meet the long transaction",
        )
        thread.join(30)
    assert stopped == ["terminated old transaction"]
    assert [type(e) for e in failures] == [errors.AdminShutdown]


def test_the_runners_watchdog_bounds_default_to_30_s_5_min_and_10_min(pg):
    with pg("sv_owner") as conn:
        arguments = conn.execute("SELECT pg_get_function_arguments('ops.stop_overrunning_reads'::regproc)").fetchone()
    assert arguments == (
        "max_statement interval DEFAULT '00:00:30'::interval, max_idle interval DEFAULT '00:05:00'::interval,"
        " max_transaction interval DEFAULT '00:10:00'::interval",
    )


def test_only_the_pipelines_may_call_the_watchdog(pg):
    with pg("sv_reader") as reader, pytest.raises(errors.InsufficientPrivilege):
        reader.execute("SELECT * FROM ops.stop_overrunning_reads()")
