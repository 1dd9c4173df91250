"""Moving the captured tables out of the views' database loses no row and no uncaptured change.

Each test builds the old layout in a scratch database (an `app` schema with its publication and a
pgoutput slot, as migration 0005 and the connector left it) and a scratch captured-tables database
from sql/app_migrations, then runs the move dbsetup runs before migration 0012.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from pipelines.cdc.captured_tables import move_captured_tables
from pipelines.dbsetup import SQL_DIR, apply_migrations, load_migrations
from pipelines.errors import DatabaseSetupError
from pipelines.settings import PostgresSettings
from tests.integration.conftest import unique

OLD_LAYOUT = """
CREATE SCHEMA app;
CREATE TABLE app.likes (oid bigint, uid bigint, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (oid, uid));
CREATE TABLE app.follows (uid bigint, target bigint, created_at timestamptz NOT NULL DEFAULT now(),
                          PRIMARY KEY (uid, target));
CREATE TABLE app.cdc_heartbeat (id int PRIMARY KEY, at timestamptz NOT NULL);
CREATE PUBLICATION old_cdc FOR TABLE app.likes, app.follows, app.cdc_heartbeat;
"""


@pytest.fixture
def layout(stack, secrets_dir, tmp_path):
    """(admin settings naming the two scratch databases, connectors folder, slot name)."""
    views, app, slot = unique("old_views"), unique("new_app"), unique("old_slot")
    admin = PostgresSettings(
        host="127.0.0.1", port=stack.pgport, user="postgres", database=views, app_database=app, secrets_dir=secrets_dir
    )
    with psycopg.connect(admin.conninfo(dbname="postgres"), autocommit=True) as conn:
        for name in (views, app):
            conn.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(admin.conninfo(), autocommit=True) as conn:
        conn.execute(OLD_LAYOUT)
        conn.execute("INSERT INTO app.likes (oid, uid) SELECT g, 1 FROM generate_series(1, 500) g")
        conn.execute("INSERT INTO app.follows (uid, target) VALUES (1, 2), (1, 3)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with psycopg.connect(admin.conninfo(dbname=app)) as conn:
        apply_migrations(conn, load_migrations(SQL_DIR / "app_migrations"))
    (tmp_path / "app-social.json").write_text(
        json.dumps({"name": "app-social", "config": {"slot.name": slot, "publication.name": "old_cdc"}})
    )
    yield admin, tmp_path, slot
    with psycopg.connect(admin.conninfo(dbname="postgres"), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        for name in (views, app):
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def rows(admin: PostgresSettings, database: str, table: str) -> int:
    with psycopg.connect(admin.conninfo(dbname=database)) as conn:
        return conn.execute(f"SELECT count(*) FROM app.{table}").fetchone()[0]


def slot_exists(admin: PostgresSettings, slot: str) -> bool:
    with psycopg.connect(admin.conninfo()) as conn:
        return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is not None


def test_every_row_moves_rows_already_there_stay_and_the_old_slot_is_dropped(layout):
    admin, connectors, slot = layout
    with psycopg.connect(admin.conninfo(dbname=admin.app_database), autocommit=True) as conn:
        conn.execute("INSERT INTO app.likes (oid, uid, created_at) VALUES (1, 1, '2020-01-01')")

    assert move_captured_tables(admin, connectors) == 501  # 499 likes + 2 follows; (1, 1) was there

    assert (rows(admin, admin.app_database, "likes"), rows(admin, admin.app_database, "follows")) == (500, 2)
    with psycopg.connect(admin.conninfo(dbname=admin.app_database)) as conn:
        kept = conn.execute("SELECT created_at::date::text FROM app.likes WHERE oid = 1").fetchone()
    assert kept == ("2020-01-01",)
    assert not slot_exists(admin, slot)
    assert move_captured_tables(admin, connectors) == 0  # run again: nothing new to copy


def test_a_change_debezium_has_not_confirmed_stops_the_move(layout):
    admin, connectors, slot = layout
    with psycopg.connect(admin.conninfo(), autocommit=True) as conn:
        conn.execute("DELETE FROM app.likes WHERE oid = 7")  # an unlike the streams have not seen

    with pytest.raises(DatabaseSetupError, match=r"holds 1 change\(s\) of app.likes/app.follows"):
        move_captured_tables(admin, connectors)
    assert slot_exists(admin, slot)
    assert rows(admin, admin.app_database, "likes") == 0


def test_heartbeats_alone_do_not_count_as_changes_to_deliver(layout):
    admin, connectors, slot = layout
    with psycopg.connect(admin.conninfo(), autocommit=True) as conn:
        conn.execute("INSERT INTO app.cdc_heartbeat VALUES (1, now())")
        conn.execute("UPDATE app.cdc_heartbeat SET at = now()")

    assert move_captured_tables(admin, connectors) == 502
    assert not slot_exists(admin, slot)


def test_a_database_without_the_old_schema_has_nothing_to_move(layout):
    admin, connectors, _ = layout
    with psycopg.connect(admin.conninfo(), autocommit=True) as conn:
        conn.execute("DROP PUBLICATION old_cdc")
        conn.execute("DROP SCHEMA app CASCADE")

    assert move_captured_tables(admin, connectors) == 0
