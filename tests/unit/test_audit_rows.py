"""How audit rows travel: binary COPY into PostgreSQL, documents and ids into Elasticsearch."""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, timedelta, timezone

from pipelines.audit.events import AuditEvent
from pipelines.audit.puller import document
from pipelines.audit.retention import cutoff
from pipelines.audit.writer import copy_rows, encode_row

TS = datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=UTC)


def test_copy_rows_are_postgres_binary_copy_with_microseconds_since_2000_jsonb_version_1_and_the_shard_last():
    events = [AuditEvent.at(42, TS, "é\t\\", {"a": "b"}), AuditEvent.at(7, TS, "x", None)]
    data = copy_rows(3, [encode_row(e)[1] for e in events])

    assert data.startswith(b"PGCOPY\n\xff\r\n\x00" + bytes(8))
    assert data.endswith(b"\xff\xff")
    micros = (TS - datetime(2000, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    first = struct.pack(">hiqiqi", 5, 8, micros, 8, 42, 4) + "é\t\\".encode() + struct.pack(">ib", 10, 1)
    assert data[19:].startswith(first + b'{"a":"b"}' + struct.pack(">ih", 2, 3))
    assert data[-12:-2] == struct.pack(">i", -1) + struct.pack(">ih", 2, 3)  # the second row: NULL fields, shard 3


def test_an_encoded_row_knows_its_utc_day():
    day, _ = encode_row(AuditEvent.at(1, TS, "x"))
    assert day == (TS.date() - date(1970, 1, 1)).days


def test_a_document_holds_the_row_its_optional_fields_and_where_it_lives():
    ts = datetime(2026, 11, 22, 11, 0, tzinfo=timezone(timedelta(hours=1)))

    doc = document("audit.shard03_20261122", 12, 5, (ts, 42, "failed login", {"action": "login"}))

    assert doc == {
        "ts": "2026-11-22T10:00:00+00:00",
        "uid": 42,
        "content": "failed login",
        "action": "login",
        "pg_table": "audit.shard03_20261122",
        "pg_ctid": "(12,5)",
    }


def test_retention_keeps_every_day_an_event_younger_than_n_days_can_fall_on():
    assert cutoff(30, today=date(2026, 11, 22)) == date(2026, 10, 23)
