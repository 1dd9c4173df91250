"""Decoding generated from a stream's declaration: every type, NULL and DEFAULT, CHECKs, keys, actions, formats.

`decode` is the reference, read record by record; `decode_batch` must give exactly the same, which the
last section checks on random mixes of good and bad records.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import msgspec
import orjson
import pytest
from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from pipelines.cv.decoding import DecodedBatch, StreamDecoder
from pipelines.cv.definitions import DefinitionError, StreamDef, parse
from pipelines.runtime.events import DELETE, DETAIL_LIMIT, INSERT, InvalidEvent

KAFKA_TS_MS = 1_795_341_600_123  # 2026-11-22T10:00:00.123Z
KAFKA_TS = datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)


def stream(columns: str, options: str = "", name: str = "s") -> StreamDef:
    return parse(f"CREATE STREAM {name} ({columns})" + (f" WITH ({options})" if options else ""), {})


def decoder(columns: str, options: str = "", output: list[str] | None = None) -> StreamDecoder:
    return StreamDecoder(stream(columns, options), output)


def encoded(value: Any) -> bytes | None:
    return value if value is None or isinstance(value, bytes) else orjson.dumps(value)


def values(dec: StreamDecoder, value: Any, key: bytes | None = None, ts: int = KAFKA_TS_MS) -> tuple:
    decoded = dec.decode(key, encoded(value), ts)
    assert decoded is not None
    return decoded[1]


def one(dec: StreamDecoder, value: Any, **kwargs: Any) -> Any:
    (result,) = values(dec, value, **kwargs)
    return result


def rejection(dec: StreamDecoder, value: Any, key: bytes | None = None, ts: int = KAFKA_TS_MS) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as caught:
        dec.decode(key, encoded(value), ts)
    assert caught.value.detail
    assert len(caught.value.detail) <= DETAIL_LIMIT
    return caught.value


class Record:
    """A Kafka record as confluent_kafka.Message shows it."""

    def __init__(self, value: bytes | None, key: bytes | None = None, ts: int = KAFKA_TS_MS) -> None:
        self._value, self._key, self._ts = value, key, ts

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1 if self._ts >= 0 else 0, self._ts)


# --- types ----------------------------------------------------------------------------------------

ACCEPTED = [
    ("smallint", -32768, -32768),
    ("smallint", 32767, 32767),
    ("integer", -(2**31), -(2**31)),
    ("integer", 2**31 - 1, 2**31 - 1),
    ("bigint", -(2**63), -(2**63)),
    ("bigint", 2**63 - 1, 2**63 - 1),
    ("bigint", b"-0", 0),
    ("numeric", b"0.1", Decimal("0.1")),  # exact: never through a float
    ("numeric", b"1.50", Decimal("1.50")),
    ("numeric", b"12345678901234567890.123456789", Decimal("12345678901234567890.123456789")),
    ("numeric", b"1e400", Decimal("1E+400")),
    ("numeric", 7, Decimal(7)),
    ("numeric", b"-0.0", Decimal("0.0")),
    ("numeric(5, 2)", b"123.45", Decimal("123.45")),
    ("numeric(5, 2)", b"-999.99", Decimal("-999.99")),
    ("numeric(5, 2)", b"1.500", Decimal("1.500")),  # trailing zeros are not decimals it lacks
    ("numeric(3)", 999, Decimal(999)),
    ("double precision", 12.5, 12.5),
    ("double precision", 12, 12.0),
    ("double precision", b"1e308", 1e308),
    ("double precision", b"0.1", 0.1),
    ("real", b"0.1", 0.10000000149011612),  # what PostgreSQL stores in a real
    ("real", b"3.4e38", 3.3999999521443642e38),
    ("boolean", True, True),
    ("boolean", False, False),
    ("text", "", ""),
    ("text", "été ✓", "été ✓"),
    ("varchar", "x" * 10_000, "x" * 10_000),
    ("varchar(3)", "abc", "abc"),
    ("varchar(3)", "ééé", "ééé"),  # characters, not bytes
    ("timestamptz", "2026-11-22T11:00:00+01:00", datetime(2026, 11, 22, 10, tzinfo=UTC)),
    ("timestamptz", KAFKA_TS_MS, KAFKA_TS),
    ("date", "2026-11-22", date(2026, 11, 22)),
    ("date", "2024-02-29", date(2024, 2, 29)),
    ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
]


@pytest.mark.parametrize(("declared", "value", "expected"), ACCEPTED)
def test_each_type_takes_its_json_values_exactly(declared, value, expected):
    dec = decoder(f"a {declared}")
    event = b'{"a": ' + value + b"}" if isinstance(value, bytes) else orjson.dumps({"a": value})

    decoded = one(dec, event)

    assert decoded == expected
    assert type(decoded) is type(expected)
    if isinstance(expected, Decimal):
        assert str(decoded) == str(expected)


def test_a_jsonb_column_takes_any_json_value_as_jsonb():
    dec = decoder("a jsonb")
    for value in [{"k": [1, 2.5, "x", None, True]}, [], "text", 7, False]:
        decoded = one(dec, {"a": value})
        assert isinstance(decoded, Jsonb)
        assert decoded.obj == value


REJECTED = [
    ("smallint", 32768, "out_of_range"),
    ("smallint", -32769, "out_of_range"),
    ("integer", 2**31, "out_of_range"),
    ("bigint", 2**63, "out_of_range"),
    ("bigint", b"18446744073709551616", "out_of_range"),
    ("bigint", b"7.0", "wrong_type"),
    ("bigint", b"1e2", "wrong_type"),
    ("bigint", "7", "wrong_type"),
    ("bigint", True, "wrong_type"),
    ("bigint", [7], "wrong_type"),
    ("numeric", "1.5", "wrong_type"),
    ("numeric", True, "wrong_type"),
    ("numeric(5, 2)", b"1234.5", "out_of_range"),
    ("numeric(5, 2)", b"1.234", "out_of_range"),  # not rounded: the producer meant another value
    ("numeric(3)", b"0.5", "out_of_range"),
    ("numeric", b"1e200000", "out_of_range"),
    ("double precision", b"1e309", "out_of_range"),
    ("double precision", b"-1" + b"0" * 400, "out_of_range"),
    ("double precision", "1.5", "wrong_type"),
    ("double precision", False, "wrong_type"),
    ("real", b"3.5e38", "out_of_range"),
    ("real", b"1e-50", "out_of_range"),  # would be lost to zero
    ("boolean", 1, "wrong_type"),
    ("boolean", "true", "wrong_type"),
    ("text", 7, "wrong_type"),
    ("text", "a\u0000b", "invalid_text"),
    ("varchar(3)", "abcd", "too_long"),
    ("varchar(3)", "a\u0000", "invalid_text"),
    ("timestamptz", "2026-11-22T10:00:00", "bad_timestamp"),
    ("timestamptz", b"1.7e12", "wrong_type"),
    ("timestamptz", True, "wrong_type"),
    ("date", "2026-02-30", "bad_date"),
    ("date", "20261122", "bad_date"),
    ("date", "2026-11-22T00:00:00Z", "bad_date"),
    ("date", "0000-01-01", "bad_date"),
    ("date", 20261122, "wrong_type"),
    ("uuid", "a0eebc999c0b4ef8bb6d6bb9bd380a11", "bad_uuid"),
    ("uuid", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", "bad_uuid"),
    ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g", "bad_uuid"),
    ("uuid", 7, "wrong_type"),
    ("jsonb", "a\u0000", "invalid_text"),
    ("jsonb", {"k\u0000": 1}, "invalid_text"),
    ("jsonb", b"[1, 1e400]", "out_of_range"),
]


@pytest.mark.parametrize(("declared", "value", "reason"), REJECTED)
def test_each_type_rejects_other_json_values_with_a_reason(declared, value, reason):
    event = b'{"a": ' + value + b"}" if isinstance(value, bytes) else orjson.dumps({"a": value})

    assert rejection(decoder(f"a {declared}"), event).reason == reason


@pytest.mark.parametrize(
    ("declared", "value", "detail"),
    [
        ("bigint", b"true", "a must be a JSON integer, got true"),
        ("bigint", b"7.0", "a must be a JSON integer, got 7.0"),
        ("bigint", b'"7"', 'a must be a JSON integer, got "7"'),
        ("smallint", b"40000", "a 40000 is out of range for smallint (-32768 .. 32767)"),
        ("numeric(5, 2)", b"1.234", "a 1.234 is out of range for numeric(5, 2)"),
        ("double precision", b"[1]", "a must be a JSON number, got [1]"),
        ("boolean", b"0", "a must be true or false, got 0"),
        ("text", b"{}", "a must be a JSON string, got {}"),
        ("varchar(3)", b'"abcd"', "a is 4 characters, over varchar(3)"),
        ("timestamptz", b"null", "a must be an RFC 3339 string or epoch milliseconds, got null"),
        ("timestamptz", b'"noon"', "a 'noon' is not an RFC 3339 date-time with an offset"),
        ("date", b'"2026-02-30"', 'a "2026-02-30" is not a date (YYYY-MM-DD)'),
        ("uuid", b'"x"', 'a "x" is not a UUID (8-4-4-4-12 hex digits)'),
    ],
)
def test_a_rejection_names_the_column_and_the_value_as_written(declared, value, detail):
    dec = decoder(f"a {declared} NOT NULL")
    assert rejection(dec, b'{"a": ' + value + b"}").detail == detail


# --- NULL, absent fields and defaults -------------------------------------------------------------


def test_a_nullable_column_is_null_when_absent_or_null():
    dec = decoder("a bigint, b text")
    assert values(dec, {}) == values(dec, {"a": None, "b": None}) == (None, None)


def test_a_not_null_column_must_have_a_value_and_null_is_not_one():
    dec = decoder("uid bigint NOT NULL")
    assert (rejection(dec, {}).reason, rejection(dec, {}).detail) == ("missing_field", "uid is missing")
    null = rejection(dec, {"uid": None})
    assert (null.reason, null.detail) == ("wrong_type", "uid must be a JSON integer, got null")


def test_a_not_null_jsonb_column_takes_json_null_as_null_and_rejects_it():
    assert rejection(decoder("a jsonb NOT NULL"), {"a": None}).reason == "wrong_type"
    assert one(decoder("a jsonb"), {"a": None}) is None


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ("bigint DEFAULT 7", 7),
        ("bigint DEFAULT -5::bigint", -5),
        ("double precision DEFAULT 0", 0.0),
        ("numeric(4, 2) DEFAULT 1.5", Decimal("1.5")),
        ("text DEFAULT 'none'", "none"),
        ("varchar(4) DEFAULT 'none'", "none"),
        ("boolean NOT NULL DEFAULT false", False),
        ("timestamptz DEFAULT '2026-11-22T10:00:00Z'", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        ("date DEFAULT '2026-11-22'::date", date(2026, 11, 22)),
        ("uuid DEFAULT 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        ("bigint DEFAULT NULL", None),
    ],
)
def test_an_absent_field_takes_the_columns_default(declared, expected):
    assert one(decoder(f"a {declared}"), {}) == expected


def test_a_jsonb_default_is_jsonb():
    assert one(decoder("a jsonb DEFAULT '{\"k\": [1]}'"), {}).obj == {"k": [1]}


def test_a_null_is_not_absent_so_it_does_not_take_the_default():
    assert one(decoder("a bigint DEFAULT 7"), {"a": None}) is None
    assert rejection(decoder("a bigint NOT NULL DEFAULT 7"), {"a": None}).reason == "wrong_type"


@pytest.mark.parametrize("default", ["now()", "current_timestamp", "clock_timestamp()"])
def test_a_default_of_now_is_the_time_of_decoding(default):
    before = datetime.now(UTC)
    decoded = one(decoder(f"a timestamptz DEFAULT {default}"), {})
    assert before <= decoded <= datetime.now(UTC)


def test_current_date_is_the_utc_date_of_decoding():
    assert one(decoder("a date DEFAULT current_date"), {}) in {
        datetime.now(UTC).date(),
        (datetime.now(UTC) - timedelta(seconds=1)).date(),
    }


def test_the_timestamp_column_takes_the_record_timestamp_when_absent_but_not_when_null():
    dec = decoder("a int, ts timestamptz", "timestamp_column = 'ts'")
    assert values(dec, {"a": 1}) == (1, KAFKA_TS)
    assert values(dec, {"a": 1, "ts": None}) == (1, None)


@pytest.mark.parametrize("ts", [-1, 253_402_300_800_000])
def test_an_unusable_record_timestamp_is_rejected_when_it_is_needed(ts):
    dec = decoder("a int, ts timestamptz", "timestamp_column = 'ts'")
    error = rejection(dec, {"a": 1}, ts=ts)
    assert error.reason == "bad_timestamp"
    assert f"record timestamp {ts}" in error.detail
    assert values(dec, {"a": 1, "ts": 0}, ts=ts) == (1, datetime(1970, 1, 1, tzinfo=UTC))


def test_output_picks_and_orders_the_columns_the_caller_needs():
    dec = decoder("a int, b text, c boolean", output=["c", "a"])
    assert values(dec, {"a": 1, "b": "x", "c": True}) == (True, 1)
    assert dec.output == ("c", "a")


@pytest.mark.parametrize("output", [["x"], ["a", "a"]])
def test_output_must_name_distinct_columns(output):
    with pytest.raises(DefinitionError, match="output"):
        decoder("a int, b int", output=output)


# --- CHECK constraints ----------------------------------------------------------------------------


def test_a_named_check_is_the_reason_and_the_detail_names_the_values_and_the_condition():
    dec = decoder("uid bigint CONSTRAINT bad_uid CHECK (uid > 0)")
    error = rejection(dec, {"uid": 0})
    assert (error.reason, error.detail) == ("bad_uid", "uid = 0 violates CHECK (uid > 0)")


def test_an_unnamed_check_is_a_check_violation():
    error = rejection(decoder("uid bigint CHECK (uid > 0)"), {"uid": -3})
    assert (error.reason, error.detail) == ("check_violation", "uid = -3 violates CHECK (uid > 0)")


def test_a_value_beyond_its_type_breaks_the_columns_named_check_too():
    dec = decoder("uid bigint CONSTRAINT id_out_of_range CHECK (uid > 0), n smallint CHECK (n > 0)")
    assert rejection(dec, b'{"uid": 18446744073709551616}').reason == "id_out_of_range"
    assert rejection(dec, {"n": 40000}).reason == "out_of_range"


def test_a_check_passes_on_null_as_in_sql():
    assert one(decoder("uid bigint CHECK (uid > 0)"), {"uid": None}) is None


def test_a_table_check_sees_every_column_and_names_their_values():
    dec = decoder("a bigint, b bigint, CONSTRAINT ordered CHECK (a < b)")
    assert values(dec, {"a": 1, "b": 2}) == (1, 2)
    error = rejection(dec, {"a": 2, "b": 2})
    assert (error.reason, error.detail) == ("ordered", "a = 2, b = 2 violates CHECK (a < b)")


def test_column_checks_come_before_table_checks_in_declared_order():
    dec = decoder("a int CONSTRAINT first CHECK (a > 0), b int CONSTRAINT second CHECK (b > 0), CHECK (a < b)")
    assert rejection(dec, {"a": 0, "b": 0}).reason == "first"
    assert rejection(dec, {"a": 1, "b": 0}).reason == "second"
    assert rejection(dec, {"a": 2, "b": 1}).reason == "check_violation"


@pytest.mark.parametrize(
    ("condition", "passing", "failing"),
    [
        ("n IN (1, 2, 3)", [1, 3, None], [0, 4]),
        ("n NOT IN (1, 2)", [0, 3, None], [1, 2]),
        ("n BETWEEN -1 AND 1", [-1, 0, 1], [-2, 2]),
        ("n NOT BETWEEN -1 AND 1", [-2, 2], [-1, 0, 1]),
        ("n % 2 = 0", [0, 2, -4], [1, -3]),
        ("n / 2 = -1", [-2, -3], [-4, -1]),  # integer division truncates toward zero
        ("-n < 0", [1], [0, -1]),
        ("n * 2 + 1 > 5", [3], [2]),
        ("n = '7'", [7], [8]),  # the literal takes the column's type
        ("n::numeric > 1.5", [2], [1]),
        ("n > 1.5", [2], [1]),
        ("n > 1.5e0", [2], [1]),
        ("n IS NOT NULL", [0], [None]),
        ("n IS NULL OR n > 0", [None, 1], [0]),
        ("NOT (n > 0)", [0, None], [1]),
        ("n > 0 AND n < 10 OR n = 100", [1, 100], [0, 10]),
    ],
)
def test_check_expressions_follow_sql_semantics(condition, passing, failing):
    dec = decoder(f"n bigint CHECK ({condition})")
    for n in passing:
        assert one(dec, {"n": n}) == n, n
    for n in failing:
        assert rejection(dec, {"n": n}).reason == "check_violation", n


@pytest.mark.parametrize(
    ("columns", "event", "passes"),
    [
        ("s text CHECK (length(s) <= 3)", {"s": "été"}, True),
        ("s text CHECK (char_length(s) <= 3)", {"s": "abcd"}, False),
        ("s text CHECK (lower(s) = s)", {"s": "abc"}, True),
        ("s text CHECK (upper(s) = s)", {"s": "abc"}, False),
        ("s text CHECK (s <> '')", {"s": ""}, False),
        ("s text CHECK (s IN ('a', 'b'))", {"s": "b"}, True),
        ("f boolean CHECK (f)", {"f": False}, False),
        ("f boolean CHECK (f = true)", {"f": True}, True),
        ("x double precision CHECK (x >= 0 AND x < 1e3)", {"x": 999.5}, True),
        ("x double precision CHECK (x / 2 > 1)", {"x": 2.0}, False),
        ("x real CHECK (x > 0.1)", {"x": 0.1}, True),  # the real 0.1 is a little more than 0.1
        ("x numeric CHECK (x * 3 = 1.5)", {"x": 0.5}, True),
        ("x numeric CHECK (x + 0.1 = 0.3)", {"x": 0.2}, True),  # exact, unlike a float
        ("t timestamptz CHECK (t >= '2026-01-01T00:00:00Z')", {"t": "2025-12-31T23:59:59Z"}, False),
        ("d date CHECK (d > '2026-01-01'::date)", {"d": "2026-01-02"}, True),
        (
            "u uuid CHECK (u <> '00000000-0000-0000-0000-000000000000')",
            {"u": "00000000-0000-0000-0000-000000000000"},
            False,
        ),
        ("j jsonb CHECK (j IS NOT NULL)", {"j": None}, False),
        ("a int, b int, CHECK (a + b < 10)", {"a": 5, "b": 5}, False),
        ("a int, b int, CHECK (a + b < 10)", {"a": 5}, True),
    ],
)
def test_checks_work_on_every_type(columns, event, passes):
    dec = decoder(columns)
    if passes:
        dec.decode(None, orjson.dumps(event), KAFKA_TS_MS)
    else:
        assert rejection(dec, event).reason == "check_violation"


@pytest.mark.parametrize(
    ("columns", "event", "detail"),
    [
        ("n int CHECK (10 / n > 1)", {"n": 0}, "n = 0: CHECK (10 / n > 1) fails: division by zero"),
        ("n int CHECK (n * 2 > 0)", {"n": 2**31 - 1}, "n = 2147483647: CHECK (n * 2 > 0) fails: integer out of range"),
        ("n bigint CHECK (n % 0 = 1)", {"n": 1}, "n = 1: CHECK (n % 0 = 1) fails: division by zero"),
        ("x float8 CHECK (x * 1e300 > 0)", {"x": 1e300}, "x = 1e+300: CHECK (x * 1e300 > 0) fails: value out of range"),
    ],
)
def test_a_check_that_fails_to_evaluate_rejects_the_event_as_postgresql_would(columns, event, detail):
    error = rejection(decoder(columns), event)
    assert error.reason == "check_violation"
    assert error.detail.startswith(detail)


def test_a_check_on_a_default_is_checked_when_the_stream_is_defined():
    with pytest.raises(DefinitionError, match=r"a = 0 violates CHECK \(a > 0\)"):
        decoder("a bigint DEFAULT 0 CHECK (a > 0)")


# --- record keys and actions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "value", "key"),
    [
        ("bigint", 42, b"42"),
        ("integer", -7, b"-7"),
        ("text", "été", "été".encode()),
        ("varchar(8)", "a b", b"a b"),
        ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ],
)
def test_the_record_key_must_be_the_kafka_key_column_as_text(declared, value, key):
    dec = decoder(f"k {declared} NOT NULL, n int", "kafka_key = 'k'")
    assert values(dec, {"k": value, "n": 1}, key=key)[1] == 1
    assert rejection(dec, {"k": value, "n": 1}, key=key + b"0").reason == "key_mismatch"


def test_a_key_mismatch_shows_both_sides():
    dec = decoder("oid bigint NOT NULL", "kafka_key = 'oid'")
    assert rejection(dec, {"oid": 42}, key=b"7").detail == "key b'7' does not match oid 42"
    assert rejection(dec, {"oid": 42}).detail == "key is missing, must be the oid as text: 42"


def test_without_kafka_key_the_record_key_is_not_read():
    assert values(decoder("a int"), {"a": 1}, key=b"anything") == (1,)


ACTIONS = "a int NOT NULL", "key = 'a', action_field = 'op', insert_actions = 'add, put', delete_actions = 'remove'"


@pytest.mark.parametrize(("event", "op"), [({}, INSERT), ({"op": "add"}, INSERT), ({"op": "put"}, INSERT)])
def test_an_event_without_its_action_or_with_an_insert_action_inserts(event, op):
    assert decoder(*ACTIONS).decode(None, orjson.dumps({"a": 1, **event}), 0) == (op, (1,))


def test_a_delete_action_deletes():
    assert decoder(*ACTIONS).decode(None, orjson.dumps({"a": 1, "op": "remove"}), 0) == (DELETE, (1,))


@pytest.mark.parametrize(
    ("action", "reason", "detail"),
    [
        (None, "wrong_type", "op must be a JSON string, got null"),
        (1, "wrong_type", "op must be a JSON string, got 1"),
        ("ADD", "unknown_action", "op must be 'add' or 'put' or 'remove', got 'ADD'"),
    ],
)
def test_any_other_action_is_rejected(action, reason, detail):
    error = rejection(decoder(*ACTIONS), {"a": 1, "op": action})
    assert (error.reason, error.detail) == (reason, detail)


# --- unknown fields, size, syntax ------------------------------------------------------------------


def test_unknown_fields_are_rejected_by_default_naming_them_and_the_known_ones():
    error = rejection(decoder(*ACTIONS), {"a": 1, "zz": 1, "extra": 2})
    assert (error.reason, error.detail) == ("unknown_field", "unknown field 'extra', 'zz'; s has a, op")


def test_unknown_fields_can_be_ignored():
    dec = decoder("a int", "unknown_fields = 'ignore'")
    assert values(dec, {"a": 1, "extra": {"anything": [1e400]}}) == (1,)


def test_an_ignored_field_must_still_be_valid_json_text():
    dec = decoder("a int", "unknown_fields = 'ignore'")
    assert rejection(dec, b'{"a": 1, "x": "\xff"}').reason == "malformed_json"
    batch = dec.decode_batch([Record(b'{"a": 1, "x": "\xff"}'), Record(b'{"a": 2}')])
    assert [(i, e.reason) for i, e in batch.rejected] == [(0, "malformed_json")]
    assert batch.columns == [[2]]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty"),
        (b"", "empty"),
        (b"{" + b" " * 100 + b"}", "oversized"),
        (b"x" * 101, "oversized"),  # before parsing
        (b"a=1", "malformed_json"),
        (b'{"a": 1', "malformed_json"),
        (b"\xff", "malformed_json"),
        (b'{"a": "\\ud800"}', "malformed_json"),  # a lone surrogate is no character
        (b"[1]", "malformed_json"),
        (b"null", "malformed_json"),
        (b'"a"', "malformed_json"),
        (b'{"a": 1} {}', "malformed_json"),
    ],
)
def test_a_value_that_is_not_one_json_object_within_the_size_limit_is_rejected(value, reason):
    assert rejection(decoder("a int", "max_event_bytes = 100"), value).reason == reason


def test_a_value_of_exactly_the_size_limit_is_read():
    assert values(decoder("a int", "max_event_bytes = 100"), b'{"a": 1' + b" " * 92 + b"}") == (1,)


# --- csv ------------------------------------------------------------------------------------------


CSV = "n bigint NOT NULL, s text, f double precision, ts timestamptz", "format = 'csv', timestamp_column = 'ts'"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"1,a,1.5,2026-11-22T10:00:00Z", (1, "a", 1.5, datetime(2026, 11, 22, 10, tzinfo=UTC))),
        (b"1,a,1.5,1795341600123", (1, "a", 1.5, KAFKA_TS)),
        (b"1,,,", (1, None, None, KAFKA_TS)),  # empty: no value
        (b'1,"",,', (1, "", None, KAFKA_TS)),  # quoted empty: the empty string
        (b'-7,"a,""b""\r\nc",1e3,', (-7, 'a,"b"\r\nc', 1000.0, KAFKA_TS)),
        (b"1, a ,0,\r\n", (1, " a ", 0.0, KAFKA_TS)),  # spaces are data; one final line break is not
        (b"1,\xc3\xa9t\xc3\xa9,0,\n", (1, "été", 0.0, KAFKA_TS)),
    ],
)
def test_a_csv_record_is_one_rfc_4180_line_of_fields_in_column_order(value, expected):
    assert CSV_DECODER.decode(None, value, KAFKA_TS_MS) == (INSERT, expected)


CSV_DECODER = decoder(*CSV)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"1,a,1.5", "malformed_csv"),
        (b"1,a,1.5,,x", "malformed_csv"),
        (b'1,a"b,1,', "malformed_csv"),
        (b'1,"a"b,1,', "malformed_csv"),
        (b'1,"a,1,', "malformed_csv"),
        (b"1,a\rb,1,", "malformed_csv"),
        (b"1,a,1,\n\n", "malformed_csv"),
        (b"\xff,a,1,", "malformed_csv"),
        (b",a,1,", "missing_field"),
        (b"01,a,1,", "wrong_type"),
        (b"1.0,a,1,", "wrong_type"),
        (b"+1,a,1,", "wrong_type"),
        (b" 1,a,1,", "wrong_type"),
        (b"1,a,.5,", "wrong_type"),
        (b"1,a,NaN,", "wrong_type"),
        (b"1,a,1e999,", "out_of_range"),
        (b"99999999999999999999,a,1,", "out_of_range"),
        (b"1,a\x00,1,", "invalid_text"),
        (b"1,a,1,yesterday", "bad_timestamp"),
        (b"1,a,1,-1", "bad_timestamp"),
    ],
)
def test_a_csv_record_is_read_as_strictly_as_json(value, reason):
    assert rejection(CSV_DECODER, value).reason == reason


@pytest.mark.parametrize(
    ("declared", "text", "expected"),
    [
        ("boolean", b"true", True),
        ("boolean", b"false", False),
        ("numeric(4, 1)", b"-12.5", Decimal("-12.5")),
        ("date", b"2026-11-22", date(2026, 11, 22)),
        ("uuid", b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        ("varchar(2)", b'"ab"', "ab"),
        ("bigint DEFAULT 5", b"", 5),
    ],
)
def test_csv_fields_of_each_type(declared, text, expected):
    assert one(decoder(f"a {declared}", "format = 'csv'"), text or b"\n") == expected


@pytest.mark.parametrize(
    ("declared", "text", "reason"),
    [
        ("boolean", b"TRUE", "wrong_type"),
        ("boolean", b"1", "wrong_type"),
        ("date", b"22/11/2026", "bad_date"),
        ("uuid", b"x", "bad_uuid"),
        ("varchar(2)", b"abc", "too_long"),
        ("jsonb", b'"{""a"": 1"', "wrong_type"),
    ],
)
def test_csv_fields_of_each_type_are_rejected_with_the_json_reasons(declared, text, reason):
    assert rejection(decoder(f"a {declared}", "format = 'csv'"), text).reason == reason


def test_a_csv_jsonb_field_is_json_text():
    assert one(decoder("a jsonb", "format = 'csv'"), b'"{""k"": [1, 2]}"').obj == {"k": [1, 2]}


def test_extra_csv_fields_can_be_ignored():
    assert values(decoder("a int, b int", "format = 'csv', unknown_fields = 'ignore'"), b"1,2,3,4") == (1, 2)


# --- debezium -------------------------------------------------------------------------------------

DEBEZIUM = (
    "id bigint NOT NULL CHECK (id > 0), name text, at timestamptz NOT NULL",
    "format = 'debezium', into = 'items', timestamp_column = 'at'",
)
COMMITTED_MS = 1_700_000_000_000
COMMITTED = datetime.fromtimestamp(COMMITTED_MS / 1000, UTC)


def change(op: str, before: Any = None, after: Any = None, **envelope: Any) -> bytes:
    event = {"before": before, "after": after, "op": op, "source": {"ts_ms": COMMITTED_MS}, "ts_ms": 1, **envelope}
    return json.dumps(event).encode()


DEBEZIUM_DECODER = decoder(*DEBEZIUM)


@pytest.mark.parametrize("op", ["c", "r", "u"])
def test_a_debezium_insert_snapshot_read_or_update_inserts_the_after_row(op):
    row = {"id": 1, "name": "x", "at": "2026-11-22T10:00:00Z"}
    expected = (INSERT, (1, "x", datetime(2026, 11, 22, 10, tzinfo=UTC)))
    assert DEBEZIUM_DECODER.decode(None, change(op, before={"id": 9}, after=row), 0) == expected


def test_a_debezium_delete_deletes_the_before_row_which_may_hold_the_key_only():
    assert DEBEZIUM_DECODER.decode(None, change("d", before={"id": 1}), 0) == (DELETE, (1, None, COMMITTED))


def test_an_absent_timestamp_column_takes_the_commit_time_then_the_record_timestamp():
    row = {"id": 1, "name": None}
    assert DEBEZIUM_DECODER.decode(None, change("c", after=row), 0)[1][2] == COMMITTED
    assert DEBEZIUM_DECODER.decode(None, change("c", after=row, source={}), KAFKA_TS_MS)[1][2] == KAFKA_TS
    assert DEBEZIUM_DECODER.decode(None, change("c", after=row, source={"ts_ms": "1"}), KAFKA_TS_MS)[1][2] == KAFKA_TS


def test_a_debezium_tombstone_carries_nothing_but_an_empty_value_is_an_error():
    assert DEBEZIUM_DECODER.decode(b'{"id": 1}', None, 0) is None
    assert rejection(DEBEZIUM_DECODER, b"").reason == "empty"


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (change("t"), "unknown_action", "change op 't' cannot be applied row by row"),
        (change("c", after=None), "missing_field", "op 'c' needs the after row, got null"),
        (change("d", before=[1]), "missing_field", "op 'd' needs the before row, got [1]"),
        (change("c", after={"name": "x"}), "missing_field", "id is missing"),
        (change("c", after={"id": "1"}), "wrong_type", 'id must be a JSON integer, got "1"'),
        (change("c", after={"id": 0}), "check_violation", "id = 0 violates CHECK (id > 0)"),
        (change("d", before={"id": 0}), "check_violation", "id = 0 violates CHECK (id > 0)"),
        (change("c", after={"id": 1, "extra": 1}), "unknown_field", "unknown field 'extra'; s has at, id, name"),
        (b'{"op": "c"', "malformed_json", None),
    ],
)
def test_a_debezium_change_that_cannot_be_applied_is_rejected(value, reason, detail):
    error = rejection(DEBEZIUM_DECODER, value)
    assert error.reason == reason
    assert detail is None or error.detail == detail


# --- every reason has an example -------------------------------------------------------------------

REJECTIONS = [
    pytest.param("a int", "", b"{" + b" " * 65_536 + b"}", "oversized", id="oversized"),
    pytest.param("a int", "", None, "empty", id="null value"),
    pytest.param("a int", "", b"{", "malformed_json", id="not JSON"),
    pytest.param("a int", "format = 'csv'", b"1,2", "malformed_csv", id="two fields for one column"),
    pytest.param("a int NOT NULL", "", b"{}", "missing_field", id="missing"),
    pytest.param("a int", "", b'{"a": "1"}', "wrong_type", id="string for int"),
    pytest.param("a int", "", b'{"b": 1}', "unknown_field", id="unknown field"),
    pytest.param(*ACTIONS, b'{"a": 1, "op": "x"}', "unknown_action", id="unknown action"),
    pytest.param(
        "a int CONSTRAINT id_out_of_range CHECK (a > 0)", "", b'{"a": 0}', "id_out_of_range", id="named check"
    ),
    pytest.param("a int CONSTRAINT self_follow CHECK (a > 0)", "", b'{"a": 0}', "self_follow", id="another name"),
    pytest.param("a smallint", "", b'{"a": 32768}', "out_of_range", id="beyond smallint"),
    pytest.param("a varchar(1)", "", b'{"a": "ab"}', "too_long", id="longer than varchar"),
    pytest.param("a int CHECK (a > 0)", "", b'{"a": 0}', "check_violation", id="unnamed check"),
    pytest.param("a timestamptz", "", b'{"a": "now"}', "bad_timestamp", id="not a timestamp"),
    pytest.param("a date", "", b'{"a": "today"}', "bad_date", id="not a date"),
    pytest.param("a uuid", "", b'{"a": "1"}', "bad_uuid", id="not a uuid"),
    pytest.param("a int NOT NULL", "kafka_key = 'a'", b'{"a": 1}', "key_mismatch", id="no key"),
    pytest.param("a text", "", b'{"a": "\\u0000"}', "invalid_text", id="NUL"),
]


@pytest.mark.parametrize(("columns", "options", "value", "reason"), REJECTIONS)
def test_an_event_breaking_its_declaration_is_rejected_with_its_reason(columns, options, value, reason):
    assert rejection(decoder(columns, options), value).reason == reason


# --- decode_batch is decode, faster ----------------------------------------------------------------


def as_decoded(dec: StreamDecoder, records: list[Record]) -> DecodedBatch:
    """What decode gives record by record, as a batch."""
    batch = DecodedBatch([], [[] for _ in dec.output])
    for i, record in enumerate(records):
        try:
            decoded = dec.decode(record.key(), record.value(), record.timestamp()[1])
        except InvalidEvent as e:
            batch.rejected.append((i, e))
            continue
        if decoded is None:
            batch.skipped += 1
            continue
        batch.ops.append(decoded[0])
        for column, value in zip(batch.columns, decoded[1], strict=True):
            column.append(value)
    return batch


def comparable(batch: DecodedBatch) -> tuple:
    """A batch as plain values: each value with its type (1 == 1.0 == True, but not here), Jsonb by content."""

    def plain(value: Any) -> Any:
        if isinstance(value, Jsonb):
            return ("jsonb", json.dumps(value.obj, sort_keys=True))
        return (type(value).__name__, value)

    columns = [[plain(v) for v in column] for column in batch.columns]
    rejected = [(i, e.reason, e.detail) for i, e in batch.rejected]
    return batch.ops, columns, rejected, batch.skipped


def test_a_batch_of_good_records_decodes_as_each_record_does():
    dec = decoder(
        "url text NOT NULL, uid bigint, latency double precision NOT NULL, ts timestamptz", "timestamp_column = 'ts'"
    )
    records = [Record(b'{"url": "/p/%d", "uid": %d, "latency": 12.5}' % (i, i), ts=KAFKA_TS_MS + i) for i in range(50)]
    batch = dec.decode_batch(records)
    assert batch.ops == [INSERT] * 50
    assert batch.columns[0][:2] == ["/p/0", "/p/1"]
    assert batch.columns[3][1] == KAFKA_TS + timedelta(milliseconds=1)
    assert comparable(batch) == comparable(as_decoded(dec, records))


def test_a_batch_reports_its_rejected_records_by_index_and_keeps_the_rest_in_order():
    dec = decoder(*ACTIONS)
    values_ = [b'{"a": 1}', b'{"a": "x"}', b'{"a": 2, "op": "remove"}', b"", b'{"a": 3, "op": "nope"}', b'{"a": 4}']
    batch = dec.decode_batch([Record(v) for v in values_])
    assert (batch.ops, batch.columns) == ([INSERT, DELETE, INSERT], [[1, 2, 4]])
    assert [(i, e.reason) for i, e in batch.rejected] == [(1, "wrong_type"), (3, "empty"), (4, "unknown_action")]


def test_kafka_messages_are_records():
    message = Message(topic="t", partition=0, offset=7, key=b"1", value=b'{"a": 1}', timestamp=(1, KAFKA_TS_MS))
    dec = decoder("a bigint NOT NULL, ts timestamptz", "kafka_key = 'a', timestamp_column = 'ts'")
    assert comparable(dec.decode_batch([message])) == ([INSERT], [[("int", 1)], [("datetime", KAFKA_TS)]], [], 0)


def test_a_debezium_batch_counts_the_tombstones_it_skips():
    batch = DEBEZIUM_DECODER.decode_batch([Record(None), Record(change("d", before={"id": 1})), Record(None)])
    assert (batch.ops, batch.skipped) == ([DELETE], 2)


def test_an_empty_batch_is_empty():
    assert comparable(decoder("a int").decode_batch([])) == ([], [[]], [], 0)


def test_a_key_given_twice_is_decoded_as_json_reads_it_the_last_one():
    # msgspec checks each occurrence, the reference only the last: the batch falls back and agrees.
    dec = decoder("a int")
    records = [Record(b'{"a": "x", "a": 1}'), Record(b'{"a": 2}')]
    assert (
        comparable(dec.decode_batch(records))
        == comparable(as_decoded(dec, records))
        == ([1, 1], [[("int", 1), ("int", 2)]], [], 0)
    )


MIX = (
    """
    id bigint NOT NULL CONSTRAINT bad_id CHECK (id > 0),
    n smallint CHECK (n <> 13),
    amount numeric(6, 2),
    score double precision,
    r real,
    flag boolean DEFAULT true,
    name varchar(4),
    note text DEFAULT 'none',
    at timestamptz NOT NULL,
    day date,
    ref uuid,
    doc jsonb,
    CONSTRAINT ordered CHECK (n IS NULL OR n < id)
    """,
    "key = 'id', kafka_key = 'id', action_field = 'op', insert_actions = 'add', delete_actions = 'del', "
    "timestamp_column = 'at', max_event_bytes = 1000",
)

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=6,
)
# For each field of MIX: values it takes, and values it does not (or that break a CHECK).
VALID = {
    "id": st.integers(1, 2**63 - 1),
    "n": st.integers(-32768, 32767).filter(lambda n: n != 13) | st.none(),
    "amount": st.decimals(min_value=-9999, max_value=9999, places=2, allow_nan=False) | st.integers(-9999, 9999),
    "score": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70),
    "r": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "flag": st.booleans() | st.none(),
    "name": st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4) | st.none(),
    "note": st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=3),
    "at": st.sampled_from(["2026-11-22T10:00:00Z", "2026-11-22T11:30:00.5+01:30", 0, KAFKA_TS_MS]),
    "day": st.dates().map(str) | st.none(),
    "ref": st.uuids().map(str) | st.uuids().map(lambda u: str(u).upper()) | st.none(),
    "doc": ANY_JSON,
    "op": st.sampled_from(["add", "del"]),
}
INVALID = {
    "id": st.sampled_from([0, -1, 2**63, 2**64, "1", 1.5, True, None]),
    "n": st.sampled_from([13, 40_000, "1", 1.0]),
    "amount": st.sampled_from([Decimal("0.001"), Decimal("10000"), "1", True]),
    "score": st.sampled_from(["1", None, [1]]) | st.just(Decimal("1e400")),
    "r": st.sampled_from([1e-50, 1e39, "1"]),
    "flag": st.sampled_from([1, "true"]),
    "name": st.sampled_from(["abcde", "a\x00", 5]),
    "note": st.sampled_from([5, [1], "\x00"]),
    "at": st.sampled_from(["2026-11-22T10:00:00", -1, 1.5, None, "x"]),
    "day": st.sampled_from(["2026-02-30", "x", 7]),
    "ref": st.sampled_from(["x", 7]),
    "doc": st.sampled_from(["\x00", {"\x00": 1}, Decimal("1e400")]),
    "op": st.sampled_from(["x", None, 1]),
}
ENCODE = msgspec.json.Encoder(decimal_format="number").encode  # a Decimal as the JSON number it is


@st.composite
def records(draw: Any) -> Record:
    """A record of the MIX stream: mostly valid, some with one field wrong, some not even JSON."""
    event = {"id": draw(VALID["id"])}
    for name in sorted(VALID):
        if name != "id" and draw(st.booleans()):
            event[name] = draw(VALID[name])
    mistake = draw(st.sampled_from(["none"] * 4 + ["value", "missing", "extra", "key", "junk", "timestamp"]))
    if mistake == "value":
        name = draw(st.sampled_from(sorted(INVALID)))
        event[name] = draw(INVALID[name])
    elif mistake == "missing":
        del event["id"]
    elif mistake == "extra":
        event["extra"] = 1
    key = str(event.get("id")).encode() if mistake != "key" else draw(st.sampled_from([None, b"0", b"x"]))
    value = ENCODE(event)
    if mistake == "junk":
        value = draw(st.sampled_from([None, b"", b"{", b"[1]", b"\xff", b'{"id": 1} x', b"{}" + b" " * 1000]))
    ts = -1 if mistake == "timestamp" else draw(st.sampled_from([KAFKA_TS_MS, 0, KAFKA_TS_MS + 1]))
    return Record(value, key, ts)


MIX_DECODER = decoder(*MIX)
MIX_IGNORING = decoder(MIX[0], MIX[1] + ", unknown_fields = 'ignore'")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), max_size=40), st.booleans())
def test_decode_batch_gives_exactly_what_decode_gives_record_by_record(batch, ignoring):
    dec = MIX_IGNORING if ignoring else MIX_DECODER
    assert comparable(dec.decode_batch(batch)) == comparable(as_decoded(dec, batch))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([b'{"n": 1, "s": "a"}', b"2,b", b"3,", b"x,y", b'"4","a""b"', b"5,c,d", b""]), max_size=20)
)
def test_decode_batch_of_csv_gives_what_decode_gives(values_):
    dec = decoder("n int NOT NULL, s text", "format = 'csv'")
    batch = [Record(v) for v in values_]
    assert comparable(dec.decode_batch(batch)) == comparable(as_decoded(dec, batch))


def test_a_batch_mostly_valid_accepts_the_valid_ones_exactly():
    good = [
        Record(
            json.dumps({"id": i, "n": 1, "amount": 1.25, "name": "ab", "at": KAFKA_TS_MS, "doc": {"k": [i]}}).encode(),
            str(i).encode(),
        )
        for i in range(2, 200)
    ]
    bad = [Record(b'{"id": 1, "n": 13}', b"1"), Record(b'{"id": 1, "name": "a\\u0000"}', b"1")]
    batch = good[:50] + bad[:1] + good[50:] + bad[1:]
    decoded = MIX_DECODER.decode_batch(batch)
    assert [(i, e.reason) for i, e in decoded.rejected] == [(50, "check_violation"), (199, "invalid_text")]
    assert decoded.columns[0] == list(range(2, 200))
    assert decoded.columns[2][0] == Decimal("1.25")
    assert comparable(decoded) == comparable(as_decoded(MIX_DECODER, batch))
