"""The `likes` and `follows` contracts: what decodes, to what, and the reason code of every rejection.

The decoders are generated from the streams' declarations in sql/views/social.sql: these tests are
the contract those declarations must keep.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest

from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.frontend.statements import parse, split_statements
from pipelines.cv.model import Scope, StreamDef
from pipelines.errors import StreamviewsError
from pipelines.runtime.events import DELETE, DETAIL_LIMIT, INSERT, REASONS, InvalidEvent

SOCIAL_SQL = Path(__file__).resolve().parents[2] / "sql" / "views" / "social.sql"
KAFKA_TS_MS = 1_795_341_600_123  # 2026-11-22T10:00:00.123Z
KAFKA_TS = datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)
MAX_ID = 2**63 - 1  # PostgreSQL bigint; ids start at 1.


def social_streams() -> dict[str, StreamDef]:
    """The streams sql/views/social.sql declares, by name."""
    streams: dict[str, StreamDef] = {}
    for statement in split_statements(SOCIAL_SQL.read_text()):
        definition = parse(statement, Scope(streams, frozenset()))
        if isinstance(definition, StreamDef):
            streams[definition.name] = definition
    return streams


STREAMS = social_streams()
decode_like = StreamDecoder(STREAMS["likes"]).decode
decode_follow = StreamDecoder(STREAMS["follows"]).decode
MAX_EVENT_BYTES = STREAMS["likes"].max_event_bytes


def like(**fields) -> bytes:
    return orjson.dumps({"oid": 42, "uid": 7, **fields})


def follow(**fields) -> bytes:
    return orjson.dumps({"uid": 7, "target": 42, **fields})


def rejection(decode, key, value) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as caught:
        decode(key, value, KAFKA_TS_MS)
    return caught.value


# --- What decodes ---------------------------------------------------------------------------------


def test_a_like_is_an_insert_of_oid_uid_ts():
    change = decode_like(b"42", like(ts="2026-11-22T10:00:00Z", action="like"), KAFKA_TS_MS)

    assert change == (INSERT, (42, 7, datetime(2026, 11, 22, 10, tzinfo=UTC)))


def test_an_unlike_is_a_delete():
    assert decode_like(b"42", like(action="unlike"), KAFKA_TS_MS) == (DELETE, (42, 7, KAFKA_TS))


def test_a_follow_is_an_insert_of_uid_target_ts():
    change = decode_follow(b"7", follow(ts=KAFKA_TS_MS, action="follow"), 0)

    assert change == (INSERT, (7, 42, KAFKA_TS))


def test_an_unfollow_is_a_delete():
    assert decode_follow(b"7", follow(action="unfollow"), KAFKA_TS_MS) == (DELETE, (7, 42, KAFKA_TS))


@pytest.mark.parametrize(("decode", "key", "value"), [(decode_like, b"42", like()), (decode_follow, b"7", follow())])
def test_without_action_and_ts_an_event_inserts_at_the_kafka_timestamp(decode, key, value):
    op, values = decode(key, value, KAFKA_TS_MS)

    assert op == INSERT
    assert values[2] == KAFKA_TS


@pytest.mark.parametrize("oid", [1, MAX_ID])
def test_ids_span_1_to_the_largest_bigint(oid):
    assert decode_like(str(oid).encode(), like(oid=oid, uid=oid), KAFKA_TS_MS)[1][:2] == (oid, oid)


def test_a_value_of_exactly_the_size_limit_is_accepted():
    value = like()
    padded = value[:-1] + b" " * (MAX_EVENT_BYTES - len(value)) + b"}"

    assert len(padded) == MAX_EVENT_BYTES
    assert decode_like(b"42", padded, KAFKA_TS_MS)[1][0] == 42


# --- Timestamps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        ("2026-11-22T10:00:00Z", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        ("2026-11-22T10:00:00.123456+02:00", datetime(2026, 11, 22, 8, 0, 0, 123456, tzinfo=UTC)),
        ("2026-11-22T10:00:00.5-03:30", datetime(2026, 11, 22, 13, 30, 0, 500000, tzinfo=UTC)),
        ("2026-11-22t10:00:00z", datetime(2026, 11, 22, 10, tzinfo=UTC)),  # RFC 3339 allows lower case
        ("2026-11-22 10:00:00+00:00", datetime(2026, 11, 22, 10, tzinfo=UTC)),  # ...and a space
        ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=UTC)),
        ("9999-12-31T23:59:59.999999Z", datetime.max.replace(tzinfo=UTC)),
        (0, datetime(1970, 1, 1, tzinfo=UTC)),
        (KAFKA_TS_MS, KAFKA_TS),
        (253_402_300_799_999, datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),  # exact to the ms
    ],
)
def test_ts_is_rfc_3339_or_epoch_milliseconds_and_comes_out_in_utc(ts, expected):
    decoded = decode_like(b"42", like(ts=ts), 0)[1][2]

    assert decoded == expected
    assert decoded.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "ts",
    [
        pytest.param("2026-11-22T10:00:00", id="no offset"),
        pytest.param("2026-11-22", id="date only"),
        pytest.param("2026-11-22T10:00Z", id="no seconds"),
        pytest.param("2026-11-22T10:00:00+0200", id="offset without colon"),
        pytest.param("2026-11-22T10:00:00+02", id="offset hours only"),
        pytest.param("20261122T100000Z", id="ISO 8601 basic format"),
        pytest.param("2026-W47-7T10:00:00Z", id="week date"),
        pytest.param("2026-11-22T10:00:00,5Z", id="comma fraction"),
        pytest.param("2026-02-30T10:00:00Z", id="no such day"),
        pytest.param("2026-11-22T10:00:60Z", id="leap second"),
        pytest.param("1969-12-31T23:59:59Z", id="before 1970"),
        pytest.param("1970-01-01T00:30:00+01:00", id="before 1970 in UTC"),
        pytest.param("9999-12-31T23:00:00-05:00", id="after 9999 in UTC"),
        pytest.param("yesterday", id="text"),
        pytest.param("", id="empty"),
        pytest.param(-1, id="epoch ms before 1970"),
        pytest.param(253_402_300_800_000, id="epoch ms after 9999"),
    ],
)
def test_other_timestamps_are_rejected(ts):
    assert rejection(decode_like, b"42", like(ts=ts)).reason == "bad_timestamp"


def test_without_ts_an_unusable_kafka_timestamp_is_rejected():
    # librdkafka reports -1 when the record has no timestamp.
    with pytest.raises(InvalidEvent) as caught:
        decode_like(b"42", like(), -1)

    assert caught.value.reason == "bad_timestamp"
    assert "record timestamp -1" in caught.value.detail


# --- What is rejected, and why --------------------------------------------------------------------


REJECTIONS = [
    pytest.param(decode_like, b"42", b"{" + b" " * MAX_EVENT_BYTES + b"}", "oversized", id="oversized"),
    pytest.param(decode_like, b"42", None, "empty", id="tombstone"),
    pytest.param(decode_like, b"42", b"", "empty", id="empty value"),
    pytest.param(decode_like, b"42", b"oid=42", "malformed_json", id="not JSON"),
    pytest.param(decode_like, b"42", b'{"oid": 42', "malformed_json", id="truncated JSON"),
    pytest.param(decode_like, b"42", b"\xff\xfe", "malformed_json", id="not UTF-8"),
    pytest.param(decode_like, b"42", b"[42, 7]", "malformed_json", id="array"),
    pytest.param(decode_like, b"42", b"null", "malformed_json", id="JSON null"),
    pytest.param(decode_like, b"42", orjson.dumps({"uid": 7}), "missing_field", id="no oid"),
    pytest.param(decode_follow, b"7", orjson.dumps({"uid": 7}), "missing_field", id="no target"),
    pytest.param(decode_like, b"42", like(uid="7"), "wrong_type", id="id as string"),
    pytest.param(decode_like, b"42", like(uid=7.0), "wrong_type", id="id as float"),
    pytest.param(decode_like, b"42", like(uid=True), "wrong_type", id="id as bool"),
    pytest.param(decode_like, b"42", like(uid=None), "wrong_type", id="id as null"),
    # Integers are read exactly, however large: beyond bigint, an id is out of its range.
    pytest.param(
        decode_like, b"42", b'{"oid": 42, "uid": 18446744073709551616}', "id_out_of_range", id="id beyond u64"
    ),
    pytest.param(decode_like, b"42", like(ts=1.7e12), "wrong_type", id="ts as float"),
    pytest.param(decode_like, b"42", like(ts=None), "wrong_type", id="ts as null"),
    pytest.param(decode_like, b"42", like(action=1), "wrong_type", id="action as number"),
    pytest.param(decode_like, b"42", like(action=None), "wrong_type", id="action as null"),
    pytest.param(decode_like, b"42", like(extra=1), "unknown_field", id="unknown field"),
    pytest.param(decode_like, b"42", like(target=1), "unknown_field", id="field of the other contract"),
    pytest.param(decode_like, b"42", like(action="follow"), "unknown_action", id="action of the other contract"),
    pytest.param(decode_like, b"42", like(action="LIKE"), "unknown_action", id="action in upper case"),
    pytest.param(decode_like, b"42", like(uid=0), "id_out_of_range", id="id 0"),
    pytest.param(decode_like, b"42", like(uid=-1), "id_out_of_range", id="negative id"),
    pytest.param(decode_like, b"42", like(uid=2**63), "id_out_of_range", id="id 2**63"),
    pytest.param(decode_like, b"42", like(ts="2026-11-22T10:00:00"), "bad_timestamp", id="ts without offset"),
    pytest.param(decode_like, None, like(), "key_mismatch", id="no key"),
    pytest.param(decode_like, b"7", like(), "key_mismatch", id="key of another object"),
    pytest.param(decode_like, b"042", like(), "key_mismatch", id="key not in canonical form"),
    pytest.param(decode_follow, b"42", follow(), "key_mismatch", id="follow keyed by target"),
    pytest.param(decode_follow, b"7", follow(target=7), "self_follow", id="self follow"),
    # The example: JSON parsers keep the last value, so this would have been applied as a like.
    pytest.param(
        decode_like,
        b"42",
        b'{"oid": 42, "uid": 7, "action": "unlike", "action": "like"}',
        "duplicate_field",
        id="action given twice",
    ),
    pytest.param(decode_like, b"42", b'{"oid": 42, "uid": 7, "uid": 8}', "duplicate_field", id="id given twice"),
]


@pytest.mark.parametrize(("decode", "key", "value", "reason"), REJECTIONS)
def test_an_event_breaking_the_contract_is_rejected_with_its_reason(decode, key, value, reason):
    error = rejection(decode, key, value)

    assert error.reason == reason
    assert error.detail
    assert len(error.detail) <= DETAIL_LIMIT


def test_every_reason_code_has_an_example():
    from tests.unit.test_audit_events import AUDIT_REJECTIONS
    from tests.unit.test_stream_formats import REJECTIONS as STREAM_REJECTIONS

    # ts_out_of_range depends on the clock: test_audit_events shows it with timestamps relative to now.
    # view_error and apply_error come from applying, not decoding: tests/integration/test_isolation.py.
    audit_reasons = {param.values[2] for param in AUDIT_REJECTIONS} | {"ts_out_of_range", "view_error", "apply_error"}
    stream_reasons = {param.values[-1] for param in STREAM_REJECTIONS}
    assert {param.values[3] for param in REJECTIONS} | stream_reasons | audit_reasons == set(REASONS)


def test_size_is_checked_before_parsing():
    assert rejection(decode_like, b"42", b"x" * (MAX_EVENT_BYTES + 1)).reason == "oversized"


def test_unknown_fields_are_named():
    error = rejection(decode_like, b"42", like(user=7, extra=1))

    assert "'extra'" in error.detail
    assert "'user'" in error.detail


def test_the_detail_names_the_field_and_the_value_as_written():
    error = rejection(decode_like, b"42", like(uid=True))

    assert error.detail == "uid must be a JSON integer, got true"


def test_the_detail_of_a_huge_value_is_truncated():
    error = rejection(decode_like, b"42", like(action="x" * 1000))

    assert error.reason == "unknown_action"
    assert len(error.detail) == DETAIL_LIMIT
    assert error.detail.startswith("action must be 'like' or 'unlike'")
    assert error.detail.endswith("...")


def test_a_key_mismatch_shows_both_sides():
    assert rejection(decode_like, b"7", like()).detail == "key b'7' does not match oid 42"
    assert rejection(decode_like, None, like()).detail == "key is missing, must be the oid as text: 42"


def test_an_invalid_event_is_a_streamviews_error_that_reads_reason_first():
    error = InvalidEvent("empty", "value is empty")

    assert isinstance(error, StreamviewsError)
    assert str(error) == "empty: value is empty"


def test_an_offset_other_than_utc_is_converted_not_dropped():
    ts = decode_like(b"42", like(ts="2026-11-22T23:30:00-05:00"), 0)[1][2]

    assert ts == datetime(2026, 11, 22, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert ts.tzinfo is UTC
