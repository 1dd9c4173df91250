"""Kafka Connect with Debezium is real: a registered connector delivers a table's changes.

Registered through the REST API, it reaches RUNNING and streams both the initial snapshot and live
inserts, with its database password resolved by a config provider rather than stored in its config.
"""

from __future__ import annotations

import json

import httpx
import pytest
from confluent_kafka import Consumer

from stack.configure import APP_DATABASE, connect_secrets
from tests.integration.conftest import unique, wait_for


@pytest.fixture
def source_table(pg):
    """A table with a publication for it, readable by the CDC role; dropped with its slot afterwards."""
    schema = unique("cdc")
    with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.likes (oid bigint, uid bigint, PRIMARY KEY (oid, uid))")
        conn.execute(f"CREATE PUBLICATION {schema}_pub FOR TABLE {schema}.likes")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_cdc")
        conn.execute(f"GRANT SELECT ON {schema}.likes TO sv_cdc")
    yield schema
    with pg("postgres", autocommit=True) as conn:
        slot = f"{schema}_slot"
        # The slot outlives the connector; it stays active until the task has fully stopped.
        wait_for(
            lambda: (
                not conn.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (slot,)
                ).fetchone()
            ),
            what=f"slot {slot} to become inactive",
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
    with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as conn:
        conn.execute(f"DROP PUBLICATION {schema}_pub")
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def connector(connect, source_table, stack, admin):
    """Register a Debezium connector for `source_table` with PUT (idempotent); delete it afterwards."""
    name = source_table.replace("_", "-")
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": "127.0.0.1",
        "database.port": str(stack.pgport),
        "database.user": "sv_cdc",
        # Resolved by the worker's DirectoryConfigProvider: the password never enters the config.
        "database.password": f"${{dir:{connect_secrets(stack.paths)}:pg_cdc_password}}",
        "database.dbname": APP_DATABASE,
        "topic.prefix": source_table,
        "table.include.list": f"{source_table}.likes",
        "publication.name": f"{source_table}_pub",
        "publication.autocreate.mode": "disabled",
        "slot.name": f"{source_table}_slot",
        "snapshot.mode": "initial",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
    }
    url = f"{connect.url}/connectors/{name}"
    for _ in range(2):  # a second PUT of the same config changes nothing
        response = httpx.put(f"{url}/config", json=config, auth=connect.basic_auth(), timeout=30)
        assert response.status_code in (200, 201), response.text
    yield name, url
    httpx.delete(url, auth=connect.basic_auth(), timeout=30).raise_for_status()
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(source_table)]
    if topics:
        for future in admin.delete_topics(topics).values():
            future.result(30)


def connector_state(url: str, auth: tuple[str, str] | None) -> str | None:
    response = httpx.get(f"{url}/status", auth=auth, timeout=10)
    if response.status_code != 200:
        return None
    status = response.json()
    tasks = status.get("tasks") or [{"state": "UNASSIGNED"}]
    if status["connector"]["state"] == "FAILED" or tasks[0]["state"] == "FAILED":
        pytest.fail(f"connector failed: {json.dumps(status)[:2000]}")
    return tasks[0]["state"] if status["connector"]["state"] == "RUNNING" else None


def test_debezium_connector_streams_snapshot_and_live_changes(pg, kafka, stack, source_table, connect, connector):
    name, url = connector
    with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {source_table}.likes VALUES (1, 100)")  # before the snapshot, most likely

    wait_for(
        lambda: connector_state(url, connect.basic_auth()) == "RUNNING", timeout=90, what=f"connector {name} RUNNING"
    )
    stored = httpx.get(f"{url}/config", auth=connect.basic_auth(), timeout=10).json()
    password = (stack.paths.secrets / "pg_cdc_password").read_text().strip()
    assert password not in json.dumps(stored)

    with pg("sv_owner", dbname=APP_DATABASE, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {source_table}.likes VALUES (2, 200)")

    topic = f"{source_table}.{source_table}.likes"
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": unique("cdc-test"),
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer.subscribe([f"^{topic}$"])  # a pattern: the topic appears when Debezium writes to it
    events: dict[int, str] = {}

    def both_rows_arrived() -> bool:
        for record in consumer.consume(num_messages=10, timeout=1):
            if record.error() is None and record.value():
                change = json.loads(record.value())
                events[change["after"]["oid"]] = change["op"]
        return len(events) == 2

    try:
        wait_for(both_rows_arrived, timeout=90, interval=0, what=f"two change events on {topic}")
    finally:
        consumer.close()
    assert events[2] == "c"  # a live insert
    assert events[1] in {"r", "c"}  # read by the snapshot, or streamed if it raced the slot creation


def test_a_connector_config_cannot_make_the_worker_resolve_and_log_another_secret(stack, connect):
    # The trick the hardening issue found: a config naming the superuser's password file made the
    # worker resolve it and log it ("Failed testing connection for jdbc:postgresql://<password>:1/x").
    secret = (stack.paths.secrets / "postgres_password").read_text().strip()
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": f"${{dir:{stack.paths.secrets}:postgres_password}}",
        "database.port": "1",
        "database.user": "x",
        "database.dbname": "x",
        "topic.prefix": "probe",
    }
    validate = f"{connect.url}/connector-plugins/PostgresConnector/config/validate"
    response = httpx.put(validate, json=config, auth=connect.basic_auth(), timeout=60)

    assert secret not in response.text
    for log in ("connect.log", "connect.out"):
        assert secret not in (stack.paths.logs / log).read_text(errors="replace"), log
    assert stack.paths.logs.stat().st_mode & 0o007 == 0  # and logs are not for other local users
    # Nor is the REST API: without the stack's credentials, nothing is validated (or resolved).
    assert httpx.put(validate, json=config, timeout=60).status_code == 401
