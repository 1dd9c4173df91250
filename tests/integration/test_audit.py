"""The audit log end to end: Kafka into per-shard, per-day tables, and the ctid puller into Elasticsearch.

Each test gets its own audit log (a schema made by `audit.create_log`) and index prefix, so the
supervised `audit` and `ctid_puller` services never see its rows. Writers and pullers run as real
processes where a test kills them, in-process where it only needs their effect.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, Producer

from pipelines.audit import retention
from pipelines.audit.events import AuditEvent
from pipelines.audit.writer import AuditSink
from pipelines.settings import PostgresSettings
from tests.integration.audit_support import (
    encoded,
    event,
    events_at,
    ids_in_elasticsearch,
    in_process_puller,
    pull_until_caught_up,
    rows_in_postgres,
    start_writer,
    write,
)
from tests.integration.conftest import unique, wait_for
from tests.integration.processes import stop_process


@pytest.fixture
def pg_settings(stack, secrets_dir) -> PostgresSettings:
    return PostgresSettings(host="127.0.0.1", port=stack.pgport, secrets_dir=secrets_dir)


def test_events_land_in_one_table_per_shard_and_day_with_brin_on_ts(pg, audit_log):
    today = datetime.now(UTC).date()
    write(pg, audit_log, events_at(today, 5, shard=3) + events_at(today - timedelta(days=1), 2, shard=0))

    with pg("sv_owner") as conn:
        tables = conn.execute(
            "SELECT table_name, rows FROM audit.tables WHERE log_schema = %s ORDER BY table_name",
            (audit_log.schema_name,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
            (audit_log.schema_name, f"shard03_{today:%Y%m%d}"),
        ).fetchall()
    assert tables == [
        (f"{audit_log.schema_name}.shard00_{today - timedelta(days=1):%Y%m%d}", 2),
        (f"{audit_log.schema_name}.shard03_{today:%Y%m%d}", 5),
    ]
    assert any("USING brin (ts)" in d for (d,) in indexes)
    assert any("USING btree (uid, ts)" in d for (d,) in indexes)


def test_the_writer_role_cannot_create_tables_itself_only_through_audit_ensure_table(pg, audit_log):
    with pg("sv_writer") as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f"CREATE TABLE {audit_log.schema_name}.mine (x int)")


def test_malformed_audit_events_go_to_the_dead_letter_topic_and_good_ones_are_all_stored(
    stack, pg, kafka, topic_factory, audit_log
):
    topic = topic_factory("audit", partitions=2)
    group = unique("audit")
    now = datetime.now(UTC)
    rng = random.Random(3)
    bad = {
        "malformed_json": (b"5", b"{not json"),
        "wrong_type": (b"5", orjson.dumps({"uid": 5, "content": 7})),
        "unknown_field": (b"5", orjson.dumps({"uid": 5, "content": "x", "Bad.Name": "y"})),
        "oversized": (b"5", b"{" + b" " * 70_000 + b"}"),
        "invalid_text": (b"5", orjson.dumps({"uid": 5, "content": "nul \u0000 here"})),
        "key_mismatch": (b"6", orjson.dumps({"uid": 5, "content": "x"})),
        "ts_out_of_range": (b"5", orjson.dumps({"uid": 5, "content": "x", "ts": "2001-01-01T00:00:00Z"})),
    }
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "message.max.bytes": 2_000_000})
    good = 0
    for i in range(300):
        uid = 1 + i % 20
        producer.produce(topic, key=str(uid), value=event(uid, now, rng, action="login"))
        good += 1
        if i % 40 == 0:
            key, value = bad[list(bad)[(i // 40) % len(bad)]]
            producer.produce(topic, key=key, value=value)
    for key, value in bad.values():
        producer.produce(topic, key=key, value=value)
    producer.flush(30)

    writer = start_writer(stack, audit_log, topic, group)
    try:
        wait_for(lambda: len(rows_in_postgres(pg, audit_log)) == good, timeout=60, what="the good events")
    finally:
        stop_process(writer)

    with pg("sv_owner") as conn:
        counted = dict(
            conn.execute("SELECT reason, count FROM ops.dead_letters WHERE group_id = %s", (group,)).fetchall()
        )
    assert set(counted) == set(bad)
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("dlq"), "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([f"{topic}.dlq"])
    reasons = []
    deadline = time.monotonic() + 30
    while len(reasons) < sum(counted.values()) and time.monotonic() < deadline:
        for message in consumer.consume(100, 0.5):
            if message.error() is None:
                reasons.append(dict(message.headers())["dlq.reason"].decode())
    consumer.close()
    assert sorted(reasons) == sorted(r for r, n in counted.items() for _ in range(n))


# --- Pulling into Elasticsearch ------------------------------------------------------------------------


def test_pulled_documents_carry_the_row_its_fields_and_its_table_and_ctid(pg, es, pg_settings, audit_log):
    today = datetime.now(UTC).date()
    ts = datetime(today.year, today.month, today.day, 9, 30, tzinfo=UTC)
    content = "failed login from 10.0.0.9\ttab\nnew line \\ backslash \u00e9\U0001f600"
    write(pg, audit_log, [(2, AuditEvent.at(42, ts, content, {"action": "login", "ip": 'x \\ " \u00e9'}))])

    pull_until_caught_up(in_process_puller(pg_settings, es, audit_log))

    table = f"{audit_log.schema_name}.shard02_{today:%Y%m%d}"
    doc = es.get(index=f"{audit_log.index_prefix}-{today:%Y.%m.%d}", id=f"{table}:0:1")["_source"]
    assert doc == {
        "ts": ts.isoformat(),
        "uid": 42,
        "content": content,
        "action": "login",
        "ip": 'x \\ " \u00e9',
        "pg_table": table,
        "pg_ctid": "(0,1)",
    }


def test_space_freed_by_an_aborted_batch_and_reused_later_is_pulled_again_without_holes(pg, es, pg_settings, audit_log):
    """The hole the seed warns about: after vacuum, the free-space map sends new rows below pulled blocks."""
    today = datetime.now(UTC).date()
    puller = in_process_puller(pg_settings, es, audit_log)
    write(pg, audit_log, events_at(today, 300))
    table = f"{audit_log.schema_name}.shard00_{today:%Y%m%d}"
    with pg("sv_writer") as conn, conn.transaction():  # a batch that aborts after writing its rows
        AuditSink(audit_log.schema_name).apply(conn, encoded(events_at(today, 300)))
        raise psycopg.Rollback
    write(pg, audit_log, events_at(today, 30))
    pull_until_caught_up(puller)
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"VACUUM {table}")  # the aborted rows' space goes to the free-space map

    write(pg, audit_log, events_at(today, 200))
    pull_until_caught_up(puller)

    with pg("sv_owner") as conn:
        rewinds = conn.execute("SELECT count(*) FROM audit.table_rewinds WHERE table_name = %s", (table,)).fetchone()
    assert rewinds[0] >= 1, "the new rows did not reuse freed space: nothing was proven"
    ids = ids_in_elasticsearch(es, audit_log)
    assert len(ids) == len(set(ids)) == 530
    assert set(ids) == rows_in_postgres(pg, audit_log)


# --- Retention -------------------------------------------------------------------------------------------


def test_retention_drops_old_days_tables_and_their_indices_and_keeps_the_rest(pg, es, pg_settings, audit_log):
    today = datetime.now(UTC).date()
    days = [today - timedelta(days=n) for n in (40, 31, 30, 0)]
    for day in days:
        write(pg, audit_log, events_at(day, 3))
    pull_until_caught_up(in_process_puller(pg_settings, es, audit_log))
    index = {day: f"{audit_log.index_prefix}-{day:%Y.%m.%d}" for day in days}
    assert all(es.indices.exists(index=name) for name in index.values())

    with psycopg.connect(pg_settings.conninfo(user="sv_indexer"), autocommit=True) as conn:
        result = retention.run(conn, es, audit_log, days=30)

    old, kept = days[:2], days[2:]
    assert result["tables_dropped"] == [f"{audit_log.schema_name}.shard00_{d:%Y%m%d}" for d in old]
    assert result["indices_deleted"] == [index[d] for d in old]
    assert not any(es.indices.exists(index=index[d]) for d in old)
    assert all(es.indices.exists(index=index[d]) for d in kept)
    assert {i.split(":")[0] for i in rows_in_postgres(pg, audit_log)} == {
        f"{audit_log.schema_name}.shard00_{d:%Y%m%d}" for d in kept
    }
    assert set(ids_in_elasticsearch(es, audit_log)) == rows_in_postgres(pg, audit_log)


# --- Queries of the read-only role ---------------------------------------------------------------------


def test_a_users_events_page_by_cursor_in_ts_order_without_overlap_or_gaps(pg, audit_log):
    today = datetime.now(UTC).date()
    noon = datetime(today.year, today.month, today.day, 12, tzinfo=UTC)
    # Ties on ts across two shards' tables: only the (ts, table, ctid) order keeps pages apart.
    batch = [
        (s, AuditEvent.at(7, noon + timedelta(seconds=i // 4), f"row {s}-{i}", None)) for s in (0, 1) for i in range(40)
    ]
    batch += [(0, AuditEvent.at(8, noon, "another user", None))]
    write(pg, audit_log, batch)
    since, until = noon - timedelta(hours=1), noon + timedelta(hours=1)

    with pg("sv_reader") as conn:
        pages, after = [], None
        while True:
            page = conn.execute(
                "SELECT content, next_cursor FROM audit.user_events(7, %s, %s, after => %s, page_size => 7,"
                " log_schema => %s)",
                (since, until, after, audit_log.schema_name),
            ).fetchall()
            if not page:
                break
            pages.append([content for content, _ in page])
            after = page[-1][1]
        everything = [
            r[0]
            for r in conn.execute(
                "SELECT content FROM audit.user_events(7, %s, %s, page_size => 1000, log_schema => %s)",
                (since, until, audit_log.schema_name),
            )
        ]
    assert [c for page in pages for c in page] == everything
    assert len(everything) == len(set(everything)) == 80
    assert len(pages) == 12


def test_text_and_regex_filters_with_an_estimated_and_an_exact_count(pg, audit_log):
    today = datetime.now(UTC).date()
    noon = datetime(today.year, today.month, today.day, 12, tzinfo=UTC)
    contents = ["Failed LOGIN from a", "login ok", "password reset", "failed login again"]
    write(pg, audit_log, [(0, AuditEvent.at(9, noon + timedelta(minutes=i), c, None)) for i, c in enumerate(contents)])
    args = (9, noon - timedelta(hours=1), noon + timedelta(hours=1))

    with pg("sv_reader") as conn:

        def call(function: str, **filters: str) -> list:
            named = "".join(f", {k} => %({k})s" for k in filters)
            return conn.execute(
                f"SELECT * FROM audit.{function}(%(u)s, %(s)s, %(e)s{named}, log_schema => %(log)s)",
                {"u": args[0], "s": args[1], "e": args[2], "log": audit_log.schema_name, **filters},
            ).fetchall()

        assert [r[2] for r in call("user_events", contains="failed login")] == [contents[0], contents[3]]
        assert [r[2] for r in call("user_events", pattern="^(login|password)")] == contents[1:3]
        assert call("user_events_count", contains="login") == [(3,)]
        assert call("user_events_estimate", contains="login")[0][0] >= 1
        with pytest.raises(psycopg.errors.RaiseException, match="not a cursor"):
            call("user_events", after="garbage")


def test_the_puller_reports_rows_and_seconds_behind_until_it_has_caught_up(pg, es, pg_settings, audit_log):
    """Seconds behind: since the oldest batch not yet indexed committed, by the database's clock."""
    today = datetime.now(UTC).date()
    puller = in_process_puller(pg_settings, es, audit_log)
    assert puller.lag()["rows_behind"] == 0

    write(pg, audit_log, events_at(today, 40))
    write(pg, audit_log, events_at(today, 10, shard=1))
    oldest = "SELECT extract(epoch FROM clock_timestamp() - min(committed_at))::float FROM audit.tables"
    oldest += " WHERE log_schema = %s"
    with pg("sv_owner", autocommit=True) as conn:
        waited_before = conn.execute(oldest, (audit_log.schema_name,)).fetchone()[0]
        lag = puller.lag()
        waited_after = conn.execute(oldest, (audit_log.schema_name,)).fetchone()[0]
    assert lag["rows_behind"] == 50
    assert waited_before - 0.001 <= lag["seconds_behind"] <= waited_after + 0.001  # rounded to the millisecond

    pull_until_caught_up(puller)
    assert puller.lag() == {"tables": 2, "rows_behind": 0, "seconds_behind": 0.0}


def test_bulk_requests_are_split_so_large_contents_never_exceed_elasticsearchs_request_limit(
    pg, es, pg_settings, audit_log, monkeypatch
):
    from pipelines.audit import bulk

    monkeypatch.setattr(bulk, "MAX_BULK_BYTES", 8_000)  # about a dozen 600-byte documents
    write(pg, audit_log, events_at(datetime.now(UTC).date(), 100))
    puller = in_process_puller(pg_settings, es, audit_log)
    sent = []
    real_bulk = es.bulk
    monkeypatch.setattr(es, "bulk", lambda **kw: sent.append(len(kw["operations"])) or real_bulk(**kw))

    pull_until_caught_up(puller)

    assert len(sent) >= 8
    assert max(sent) <= 8_000
    assert set(ids_in_elasticsearch(es, audit_log)) == rows_in_postgres(pg, audit_log)
