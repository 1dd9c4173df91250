"""Decoding generated from a stream's declaration: every type, NULL and DEFAULT, CHECKs, keys, actions.

`decode` is the reference, read record by record (test_stream_decoding_batch.py checks that
`decode_batch` gives exactly the same).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import orjson
import pytest

from pipelines.cv.model import DefinitionError
from pipelines.runtime.events import DELETE, INSERT
from tests.unit.decoding_helpers import (
    ACTIONS,
    KAFKA_TS,
    KAFKA_TS_MS,
    Record,
    decoder,
    one,
    rejection,
    values,
)

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
    ("numeric", b"9" * 5000 + b".5", Decimal("9" * 5000 + ".5")),
    ("numeric", b"1" * 5000, Decimal("1" * 5000)),  # beyond the 4300 digits int() reads
    ("numeric", b"1e131071", Decimal("1e131071")),
    ("numeric", b"1e-16383", Decimal("1e-16383")),
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
    ("double precision", b"2.5e-324", 5e-324),  # the least double: kept, as PostgreSQL keeps it
    ("real", b"1.4e-45", 1.401298464324817e-45),  # the least real
    ("jsonb", b'"\\\\u0000"', '"\\\\u0000"'),  # a backslash, then u0000: text, not NUL
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


def test_a_jsonb_column_takes_any_json_value_as_the_json_text_written():
    dec = decoder("a jsonb")
    for text in [b'{"k": [1, 2.5, "x", null, true]}', b"[]", b'"text"', b"7", b"false", b'{"a":1,"a":2}']:
        assert one(dec, b'{"a": ' + text + b"}") == text.decode()


@pytest.mark.parametrize(
    "number",
    [
        # Numbers jsonb keeps exactly, where a double would round or refuse them.
        b"0.1000000000000000055511151231257827",
        b"12345678901234567.5",
        b"18446744073709551617",
        b"1e400",
        b"1e-400",
        b"-0.0",
        b"1" * 5000,  # beyond the 4300 digits Python's int() reads
        b"1e131071",  # 131072 digits before the point: numeric's most
        b"1e-16383",  # 16383 after it
        b"0e999999999",
    ],
)
def test_a_jsonb_number_is_kept_as_written(number):
    assert one(decoder("a jsonb"), b'{"a": [' + number + b"]}") == "[" + number.decode() + "]"


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
    ("jsonb", b"[1, 1e131072]", "out_of_range"),  # beyond numeric: PostgreSQL's jsonb refuses it
    ("jsonb", b"[1, 1.0e-16383]", "out_of_range"),  # 16384 digits after the point, as written
    ("jsonb", b"0e-16384", "out_of_range"),
    ("jsonb", b"0e1073741823", "out_of_range"),
    ("jsonb", b'{"\\u0000": 1}', "invalid_text"),
    ("bigint", b"1" * 5000, "out_of_range"),  # beyond the 4300 digits int() reads: still a number
    ("numeric", b"1e131072", "out_of_range"),  # PostgreSQL's numeric input: 131072 digits before the point
    ("numeric", b"1.0e-16383", "out_of_range"),  # and 16383 after it, as written
    ("numeric", b"0e-16384", "out_of_range"),
    ("double precision", b"1" * 5000, "out_of_range"),
    ("double precision", b"1e-400", "out_of_range"),  # lost to zero: PostgreSQL's input rejects it
    ("double precision", b"-2.4703282292062327e-324", "out_of_range"),  # just under half the least double
    ("real", b"7e-46", "out_of_range"),
    ("real", b"1e39", "out_of_range"),
    ("timestamptz", b"1" * 5000, "bad_timestamp"),
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


def test_a_jsonb_default_is_its_json_text():
    assert one(decoder("a jsonb DEFAULT '{\"k\": [1]}'"), {}) == '{"k": [1]}'


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
        # upper() and lower() as PostgreSQL's under glibc (C.UTF-8): one character to one character.
        ("s text CHECK (upper(s) = s)", {"s": "ß"}, True),
        ("s text CHECK (upper(s) = s)", {"s": "ﬁ"}, True),
        ("s text CHECK (length(upper(s)) = 2)", {"s": "ßa"}, True),
        ("s text CHECK (lower(s) = 'i')", {"s": "İ"}, True),
        ("s text CHECK (lower(s) = '\u03c3\u03c3')", {"s": "\u03a3\u03a3"}, True),  # no final sigma
        ("s text CHECK (upper(s) = 'ᾼ')", {"s": "ᾳ"}, True),
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
        (b'{"a": "\\ud800"}', "invalid_text"),  # a lone surrogate is no character: not text
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


# --- nesting --------------------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("unknown_fields", ["reject", "ignore"])
def test_an_event_nested_deeper_than_500_levels_is_out_of_range_in_both_decoders(unknown_fields):
    # The event's own object is a level: a jsonb value may nest 499 deep. Deeper is a real reason,
    # not `undecodable` (the runner's word for a decoder that raised).
    dec = decoder("tag text NOT NULL, j jsonb", f"unknown_fields = '{unknown_fields}'")
    records = [Record(b'{"tag": "x", "j": ' + nested(depth) + b"}") for depth in (499, 500, 1100)]

    for batch in (dec.decode_batch(records), dec.decode_each(records)):
        assert batch.columns[1] == [nested(499).decode()]
        assert [(i, e.reason) for i, e in batch.rejected] == [(1, "out_of_range"), (2, "out_of_range")]
        assert batch.rejected[1][1].detail == "value is nested 1101 deep, over the 500 levels decoding reads"


def test_brackets_inside_strings_do_not_nest():
    dec = decoder("j jsonb")
    text = b'["' + b"[" * 2000 + b'"]'
    assert one(dec, b'{"j": ' + text + b"}") == text.decode()


def test_a_likes_event_with_a_value_nested_1100_deep_is_out_of_range():
    likes = decoder("oid bigint NOT NULL, uid bigint NOT NULL", "unknown_fields = 'ignore'")
    assert rejection(likes, b'{"oid": 1, "uid": 2, "x": ' + nested(1100) + b"}").reason == "out_of_range"
    assert rejection(decoder("oid bigint NOT NULL"), b'{"oid": ' + nested(1100) + b"}").reason == "out_of_range"
