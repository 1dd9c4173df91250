"""Decoding generated from a stream's declaration: NULL, absent fields, DEFAULTs, the record timestamp, output columns.

Read by `decode`, the reference (see test_stream_decoding_types.py).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from pipelines.cv.model import DefinitionError
from tests.unit.decoding_helpers import (
    KAFKA_TS,
    decoder,
    one,
    rejection,
    values,
)

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
