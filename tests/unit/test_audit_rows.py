"""How audit rows travel: COPY text lines into PostgreSQL, documents and ids into Elasticsearch."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

from pipelines.audit import copy_text
from pipelines.ctid_puller import document
from pipelines.events import AuditEvent
from pipelines.retention import cutoff

TS = datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=UTC)


def test_copy_lines_escape_what_copy_text_format_would_misread():
    line = copy_text(3, [AuditEvent(42, TS, "a\tb\nc\rd\\e", {"note": 'say "\\hi"'})])

    assert line == (
        "3\t2026-11-22T10:00:00.123456+00:00\t42\ta\\tb\\nc\\rd\\\\e\t" + '{"note":"say \\\\"\\\\\\\\hi\\\\""}' + "\n"
    )


def test_an_event_without_optional_fields_copies_null_fields():
    assert copy_text(0, [AuditEvent(1, TS, "x", None)]).split("\t")[-1] == "\\N\n"


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
