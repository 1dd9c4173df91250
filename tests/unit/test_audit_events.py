"""The `audit` contract: what decodes, what the optional fields may be, and every rejection's reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from pipelines.audit.events import (
    MAX_AUDIT_BYTES,
    MAX_AUDIT_EXTRAS,
    MAX_EXTRA_CHARS,
    AuditDecoder,
    AuditEvent,
    decode_audit,
)
from pipelines.runtime.events import InvalidEvent

KAFKA_TS_MS = 1_795_341_600_123  # 2026-11-22T10:00:00.123Z


def audit(**fields) -> bytes:
    return orjson.dumps({"uid": 42, "content": "failed login", **fields})


def rejection(key, value, decode=decode_audit) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as caught:
        decode(key, value, KAFKA_TS_MS)
    return caught.value


def test_an_audit_event_decodes_with_its_optional_string_fields_kept_as_they_are():
    event = decode_audit(
        b"42", audit(ts="2026-11-22T11:00:00+01:00", action="login", ip="10.0.0.1", source="web"), KAFKA_TS_MS
    )

    assert event == AuditEvent.at(
        42,
        datetime(2026, 11, 22, 10, 0, tzinfo=UTC),
        "failed login",
        {"action": "login", "ip": "10.0.0.1", "source": "web"},
    )


def test_without_optional_fields_there_is_no_fields_object_and_ts_defaults_to_the_record_timestamp():
    event = decode_audit(b"42", audit(), KAFKA_TS_MS)

    assert event.fields is None
    assert event.ts == datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)


def test_times_are_exact_to_the_microsecond_from_either_form():
    assert decode_audit(b"42", audit(ts=KAFKA_TS_MS), 0).micros == KAFKA_TS_MS * 1000
    event = decode_audit(b"42", audit(ts="2026-11-22T10:00:00.123456-02:00"), 0)
    assert event.ts == datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC)
    assert event.day == (datetime(2026, 11, 22, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)).days


def test_content_may_hold_any_text_postgres_can_store():
    text = "tab\there\nnew line \\ backslash \u00e9\u4e2d\U0001f600"

    assert decode_audit(b"42", audit(content=text), KAFKA_TS_MS).content == text


AUDIT_REJECTIONS = [
    pytest.param(b"42", b"{" + b" " * MAX_AUDIT_BYTES + b"}", "oversized", id="oversized value"),
    pytest.param(b"42", None, "empty", id="tombstone"),
    pytest.param(b"42", b"not json", "malformed_json", id="not JSON"),
    pytest.param(b"42", orjson.dumps({"uid": 42}), "missing_field", id="no content"),
    pytest.param(b"42", orjson.dumps({"content": "x"}), "missing_field", id="no uid"),
    pytest.param(b"42", audit(content=7), "wrong_type", id="content as number"),
    pytest.param(b"42", audit(content=None), "wrong_type", id="content as null"),
    pytest.param(b"42", audit(action=1), "wrong_type", id="optional field as number"),
    pytest.param(b"42", audit(tags=["a"]), "wrong_type", id="optional field as array"),
    pytest.param(b"42", audit(action="x" * (MAX_EXTRA_CHARS + 1)), "oversized", id="optional field too long"),
    pytest.param(b"42", audit(**{"Action": "x"}), "unknown_field", id="field name in upper case"),
    pytest.param(b"42", audit(**{"a.b": "x"}), "unknown_field", id="dotted field name"),
    pytest.param(b"42", b'{"uid": 42, "content": "a", "content": "b"}', "duplicate_field", id="content given twice"),
    pytest.param(b"42", audit(pg_ctid="(0,1)"), "unknown_field", id="a document metadata name"),
    pytest.param(
        b"42",
        audit(**{f"f{i}": "x" for i in range(MAX_AUDIT_EXTRAS + 1)}),
        "unknown_field",
        id="too many optional fields",
    ),
    pytest.param(b"42", audit(content="a\u0000b"), "invalid_text", id="NUL in content"),
    pytest.param(b"42", audit(action="a\u0000"), "invalid_text", id="NUL in an optional field"),
    pytest.param(b"7", audit(), "key_mismatch", id="keyed by another user"),
    pytest.param(None, audit(), "key_mismatch", id="no key"),
    pytest.param(b"42", audit(uid=0), "id_out_of_range", id="uid 0"),
    pytest.param(b"42", audit(ts="yesterday"), "bad_timestamp", id="ts not RFC 3339"),
]


@pytest.mark.parametrize(("key", "value", "reason"), AUDIT_REJECTIONS)
def test_an_audit_event_breaking_the_contract_is_rejected_with_its_reason(key, value, reason):
    error = rejection(key, value)

    assert error.reason == reason
    assert error.detail


def test_events_older_than_retention_or_a_day_ahead_are_rejected_so_no_dropped_day_comes_back():
    decode = AuditDecoder(max_age=timedelta(days=30))
    now = datetime.now(UTC)

    def at(when: datetime) -> bytes:
        return audit(ts=when.isoformat())

    assert decode(b"42", at(now - timedelta(days=29)), KAFKA_TS_MS).uid == 42
    assert decode(b"42", at(now + timedelta(hours=23)), KAFKA_TS_MS).uid == 42
    assert rejection(b"42", at(now - timedelta(days=31)), decode).reason == "ts_out_of_range"
    assert rejection(b"42", at(now + timedelta(days=2)), decode).reason == "ts_out_of_range"
