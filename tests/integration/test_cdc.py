"""Change data capture: rows written to app.likes and app.follows reach the same social views.

The captured tables live in their own database (APP_DATABASE), the only one the CDC role may reach.

Debezium (registered by `make up` from connectors/app-social.json) streams the tables' changes; the
supervised stream runner applies them through the declared streams app_likes and app_follows
(sql/views/social.sql), which feed `likes` and `follows`. Each test uses its own ids.
"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer

from pipelines.cdc.connectors import CONNECTORS_DIR, load
from pipelines.cv import catalog
from pipelines.cv.runner import DEFAULT_GROUP
from pipelines.settings import ConnectSettings, PostgresSettings
from stack.configure import APP_DATABASE, connect_secrets, read_secret
from stack.services import readiness_check
from stack.supervisor import Supervisor
from tests.integration.conftest import delete_topics, throwaway_views, unique, wait_for


@pytest.fixture(scope="module")
def connector(connect, stack):
    """The app-social connector, RUNNING with its task (polled, never slept for)."""

    def running() -> bool:
        response = httpx.get(f"{connect.url}/connectors/app-social/status", auth=connect.basic_auth(), timeout=10)
        if response.status_code != 200:
            return False
        status = response.json()
        tasks = status.get("tasks", [])
        return status["connector"]["state"] == "RUNNING" and bool(tasks) and tasks[0]["state"] == "RUNNING"

    wait_for(running, timeout=120, what="the app-social connector and its task RUNNING")
    return "app-social"


@pytest.fixture
def ids():
    base = random.randrange(10**12, 10**15) * 1000
    return lambda n: base + n


@pytest.fixture
def app(pg):
    with pg("sv_writer", dbname=APP_DATABASE, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def reader(pg):
    with pg("sv_reader", autocommit=True) as conn:
        yield conn


def read(conn, sql, *args):
    return conn.execute(sql, args).fetchone()[0]


def test_inserted_and_deleted_rows_become_likes_and_unlikes(connector, app, reader, ids):
    post = ids(1)
    for uid in (ids(2), ids(3), ids(4)):
        app.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, %s)", (post, uid))
    app.execute("DELETE FROM app.likes WHERE oid = %s AND uid = %s", (post, ids(3)))

    wait_for(lambda: sorted(read(reader, "SELECT social.likers(%s)", post)) == [ids(2), ids(4)], what="CDC likes")
    assert read(reader, "SELECT social.like_count(%s)", post) == 2
    assert sorted(read(reader, "SELECT social.liked_objects(%s)", ids(2))) == [post]


def test_follow_rows_feed_following_followers_and_friends_who_like(connector, app, reader, ids):
    me, friend, stranger, post = ids(1), ids(2), ids(3), ids(4)
    app.execute("INSERT INTO app.follows (uid, target) VALUES (%s, %s), (%s, %s)", (me, friend, me, stranger))
    app.execute("DELETE FROM app.follows WHERE uid = %s AND target = %s", (me, stranger))
    app.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, %s), (%s, %s)", (post, friend, post, stranger))

    wait_for(lambda: read(reader, "SELECT social.friends_who_like(%s, %s)", me, post) == [friend], what="friends")
    assert read(reader, "SELECT social.following(%s)", me) == [friend]
    assert read(reader, "SELECT social.followers(%s)", friend) == [me]


def test_changing_a_rows_key_moves_the_like_and_other_updates_change_nothing(connector, app, reader, ids):
    post, moved_to, fan = ids(1), ids(2), ids(3)
    app.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, %s)", (post, fan))
    app.execute("UPDATE app.likes SET created_at = now() - interval '1 day' WHERE oid = %s", (post,))
    app.execute("UPDATE app.likes SET oid = %s WHERE oid = %s", (moved_to, post))

    wait_for(lambda: read(reader, "SELECT social.likers(%s)", moved_to) == [fan], what="the like to move")
    assert read(reader, "SELECT social.like_count(%s)", post) == 0


def test_likes_from_kafka_and_from_table_rows_meet_in_one_set(connector, app, reader, ids, kafka):
    from confluent_kafka import Producer

    post = ids(1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce("likes", key=str(post), value=f'{{"oid": {post}, "uid": {ids(2)}}}')
    producer.flush(30)
    app.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, %s), (%s, %s)", (post, ids(2), post, ids(3)))

    wait_for(lambda: read(reader, "SELECT social.like_count(%s)", post) == 2, what="one set from both sources")
    assert sorted(read(reader, "SELECT social.likers(%s)", post)) == [ids(2), ids(3)]


def test_the_replication_slot_keeps_up_while_the_captured_tables_are_idle(connector, pg):
    """Heartbeats let the slot confirm WAL written elsewhere, so an idle capture retains none of it."""
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute("CREATE TEMP TABLE churn AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 20000) g")
        owner.execute("UPDATE churn SET pad = pad || 'y'")  # WAL that no captured table explains
    with pg("sv_cdc", dbname=APP_DATABASE, autocommit=True) as cdc:
        start = cdc.execute("SELECT pg_current_wal_lsn()").fetchone()[0]

        def confirmed_past_start() -> bool:
            row = cdc.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (start, "streamviews_app_social"),
            ).fetchone()
            return bool(row and row[0])

        # Heartbeat every 10 s, offsets flushed every 10 s: the slot passes the churn within a minute.
        wait_for(confirmed_past_start, timeout=90, interval=1, what="the slot to confirm WAL past the churn")


def test_a_snapshot_of_rows_already_streamed_counts_each_once(connector, connect, stack, pg, kafka, admin, ids):
    """A fresh slot snapshots every row again; rows already delivered change nothing.

    A second connector with its own slot reads all existing rows of app.likes into its own topic. A
    stream declared on that topic, on the running system, feeds them into `likes` through the
    supervised runner: the rows the first connector already delivered change nothing.
    """
    post = ids(1)
    with pg("sv_writer", dbname=APP_DATABASE, autocommit=True) as app:
        for uid in range(1, 21):
            app.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, %s)", (post, ids(100 + uid)))
    with pg("sv_reader", autocommit=True) as reader:
        wait_for(lambda: read(reader, "SELECT social.like_count(%s)", post) == 20, what="the first delivery")

    name = f"snapshot-{ids(0) % 10**9}"
    prefix, slot = name.replace("-", "_"), f"{name.replace('-', '_')}_slot"
    config = {
        **load(
            CONNECTORS_DIR / "app-social.json",
            PostgresSettings(port=stack.pgport, secrets_dir=stack.paths.secrets),
            ConnectSettings(providers_dir=connect_secrets(stack.paths), secrets_dir=stack.paths.secrets),
        )[1],
        "topic.prefix": prefix,
        "slot.name": slot,
        "table.include.list": "app.likes",
    }
    config.pop("heartbeat.action.query")
    httpx.put(
        f"{connect.url}/connectors/{name}/config", json=config, auth=connect.basic_auth(), timeout=60
    ).raise_for_status()
    topic, group = f"{prefix}.app.likes", f"it-{name}"
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(
            owner,
            f"CREATE STREAM {prefix} (oid bigint NOT NULL, uid bigint NOT NULL, created_at timestamptz NOT NULL)"
            f" WITH (topic = '{topic}', format = 'debezium', into = 'likes', timestamp_column = 'created_at')",
        )
    try:
        # Find this object's 20 rows in the snapshot, then wait until the pipeline committed past them.
        needed: dict[int, int] = {}
        found = 0
        reader_group = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": f"{group}-check",
                "auto.offset.reset": "earliest",
                # A pattern finds a new topic at the next metadata refresh (5 minutes by default).
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        reader_group.subscribe([f"^{topic}$"])

        def snapshot_records_seen() -> bool:
            nonlocal found
            for record in reader_group.consume(num_messages=500, timeout=1):
                change = json.loads(record.value()) if record.error() is None and record.value() else {}
                if (change.get("after") or {}).get("oid") == post and change.get("op") == "r":
                    found += 1
                    needed[record.partition()] = max(needed.get(record.partition(), 0), record.offset() + 1)
            return found == 20

        try:
            wait_for(snapshot_records_seen, timeout=180, interval=0, what="this object's 20 rows in the snapshot")
        finally:
            reader_group.close()

        def snapshot_applied() -> bool:
            with pg("sv_owner") as owner:
                committed = dict(
                    owner.execute(
                        "SELECT partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s",
                        (DEFAULT_GROUP, topic),
                    ).fetchall()
                )
            return all(committed.get(p, 0) >= offset for p, offset in needed.items())

        wait_for(snapshot_applied, timeout=180, interval=0.5, what="the snapshot applied through the new stream")
        with pg("sv_reader") as reader:
            assert read(reader, "SELECT social.like_count(%s)", post) == 20
    finally:
        with pg("sv_owner", autocommit=True) as owner:
            catalog.drop(owner, [prefix], "stream")
        httpx.delete(f"{connect.url}/connectors/{name}", auth=connect.basic_auth(), timeout=30)
        with pg("postgres", autocommit=True) as conn:
            wait_for(
                lambda: (
                    not conn.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (slot,)
                    ).fetchone()
                ),
                what="the snapshot slot released",
            )
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        stale = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
        if stale:
            for future in admin.delete_topics(stale).values():
                future.result(30)


@pytest.fixture
def captured_items(connect, stack, pg, admin):
    """A captured table `<schema>.items (id PRIMARY KEY, val, n)` of the app database, and a view of it.

    Its own connector feeds a Debezium stream keyed by id, with a view of the rows per val; all of
    it is dropped afterwards. Yields (schema, the view's name).
    """
    schema = unique("cdc_items")
    name, slot = schema.replace("_", "-"), f"{schema}_slot"
    stream, topic = f"{schema}_rows", f"{schema}.{schema}.items"
    with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.items (id bigint PRIMARY KEY, val text NOT NULL, n int NOT NULL)")
        conn.execute(f"CREATE PUBLICATION {schema}_pub FOR TABLE {schema}.items")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_cdc")
        conn.execute(f"GRANT SELECT ON {schema}.items TO sv_cdc")
    config = {
        **load(
            CONNECTORS_DIR / "app-social.json",
            PostgresSettings(port=stack.pgport, secrets_dir=stack.paths.secrets),
            ConnectSettings(providers_dir=connect_secrets(stack.paths), secrets_dir=stack.paths.secrets),
        )[1],
        "topic.prefix": schema,
        "slot.name": slot,
        "table.include.list": f"{schema}.items",
        "publication.name": f"{schema}_pub",
        "snapshot.mode": "initial",
    }
    config.pop("heartbeat.action.query")
    definitions = f"""
        CREATE STREAM {stream} (id bigint NOT NULL, val text NOT NULL, n int NOT NULL)
            WITH (topic = '{topic}', format = 'debezium', key = 'id');
        CREATE CONTINUOUS VIEW {schema}.per_val AS
            SELECT val, count(*) AS n_rows, sum(n) AS total FROM {stream} GROUP BY val;
        """
    url = f"{connect.url}/connectors/{name}"
    try:
        with throwaway_views(pg, schema, [stream], definitions):
            httpx.put(f"{url}/config", json=config, auth=connect.basic_auth(), timeout=60).raise_for_status()
            yield schema, f"{schema}.per_val"
    finally:
        httpx.delete(url, auth=connect.basic_auth(), timeout=30)
        with pg("postgres", autocommit=True) as conn:
            wait_for(
                lambda: (
                    not conn.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (slot,)
                    ).fetchone()
                ),
                what="the items slot released",
            )
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
        with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION {schema}_pub")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
        delete_topics([t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{schema}.")])


def test_a_view_over_captured_rows_equals_the_table_through_inserts_updates_and_deletes(captured_items, pg):
    """The oracle is the captured table itself: after any mix of changes, the view equals its GROUP BY.

    Updates of a column outside the key (val, n) must take the old row out of its group and put the
    new one in: applied as an insert of a key already present, they would change nothing.
    """
    schema, view = captured_items
    rng = random.Random()
    with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as app, pg("sv_owner", autocommit=True) as views:

        def table() -> list[tuple]:
            query = f"SELECT val, count(*), sum(n) FROM {schema}.items GROUP BY val ORDER BY val"
            return app.execute(query).fetchall()

        def view_equals_table() -> bool:
            rows = views.execute(f"SELECT val, n_rows, total FROM {view} WHERE n_rows > 0 ORDER BY val").fetchall()
            return rows == table()

        # Streaming, not snapshotting: a first row has come through before the changes under test.
        app.execute(f"INSERT INTO {schema}.items VALUES (0, 'a', 1)")
        wait_for(view_equals_table, timeout=180, interval=0.5, what="the connector streaming into the view")
        ids = [0]
        for step in range(300):
            action = rng.choice(["insert", "update val", "update n", "update both", "delete", "move"])
            if action == "insert" or not ids:
                ids.append(max(ids, default=0) + 1)
                app.execute(f"INSERT INTO {schema}.items VALUES (%s, %s, %s)", (ids[-1], rng.choice("abc"), step))
            elif action == "delete":
                app.execute(f"DELETE FROM {schema}.items WHERE id = %s", (ids.pop(rng.randrange(len(ids))),))
            elif action == "move":  # a key change: Debezium sends a delete and a create
                old, new = ids.pop(rng.randrange(len(ids))), max(ids, default=0) + 1000
                app.execute(f"UPDATE {schema}.items SET id = %s WHERE id = %s", (new, old))
                ids.append(new)
            else:
                sets = {"update val": "val = %(val)s", "update n": "n = %(n)s"}.get(action, "val = %(val)s, n = %(n)s")
                app.execute(
                    f"UPDATE {schema}.items SET {sets} WHERE id = %(id)s",
                    {"id": rng.choice(ids), "val": rng.choice("abc"), "n": rng.randrange(100)},
                )
        wait_for(view_equals_table, timeout=180, interval=0.5, what="the view to equal the captured table")


def test_no_change_is_lost_when_connect_and_then_postgres_restart_mid_stream(connector, stack, pg, ids):
    """Runs last in this module: it restarts the database, which drops every open connection."""
    supervisor = Supervisor(stack.paths)
    password = read_secret(stack.paths, "elastic_password")
    post = ids(1)
    committed: list[int] = []
    stop = threading.Event()

    def write_likes() -> None:
        uid = 0
        while not stop.is_set():
            uid += 1
            while not stop.is_set():
                try:
                    with pg("sv_writer", dbname=APP_DATABASE, autocommit=True) as conn:
                        conn.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, %s)", (post, uid))
                    committed.append(uid)
                    break
                except psycopg.OperationalError:
                    time.sleep(0.2)  # the database is restarting: try the same row again

    writer = threading.Thread(target=write_likes, daemon=True)
    writer.start()
    try:
        for service in ("connect", "postgres"):
            before = len(committed)
            wait_for(lambda before=before: len(committed) > before + 50, timeout=60, what="likes being written")
            supervisor.stop(service)
            supervisor.start(service)
            wait_for(readiness_check(service, stack, password), timeout=120, what=f"{service} back")
        wait_for(lambda: len(committed) > 300, timeout=60, what="likes after the restarts")
    finally:
        stop.set()
        writer.join(30)

    def all_likes_visible() -> bool:
        try:
            with pg("sv_reader") as conn:
                return read(conn, "SELECT social.like_count(%s)", post) == len(committed)
        except psycopg.OperationalError:
            return False

    wait_for(all_likes_visible, timeout=240, interval=1, what=f"all {len(committed)} committed likes visible")
