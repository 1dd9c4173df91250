"""Decoding generated from a stream's declaration: each column type takes its values exactly, or names why not.

`decode` is the reference, read record by record (test_stream_decoding_batch.py checks that
`decode_batch` gives exactly the same).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import orjson
import pytest

from tests.unit.decoding_helpers import (
    KAFKA_TS,
    KAFKA_TS_MS,
    decoder,
    one,
    rejection,
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
