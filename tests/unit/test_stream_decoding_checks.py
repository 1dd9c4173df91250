"""Decoding generated from a stream's declaration: CHECK constraints, with SQL's semantics on every type.

Read by `decode`, the reference (see test_stream_decoding_types.py).
"""

from __future__ import annotations

import orjson
import pytest

from pipelines.cv.model import DefinitionError
from tests.unit.decoding_helpers import (
    KAFKA_TS_MS,
    decoder,
    one,
    rejection,
    values,
)

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
