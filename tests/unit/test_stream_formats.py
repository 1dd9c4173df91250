"""The other formats a stream can declare (csv, Debezium change events), and every reason with an example."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from pipelines.cv.decoding.stream_decoder import REPLACE
from pipelines.runtime.events import DELETE, INSERT
from tests.unit.decoding_helpers import (
    ACTIONS,
    COMMITTED,
    DEBEZIUM_DECODER,
    KAFKA_TS,
    KAFKA_TS_MS,
    Record,
    change,
    decoder,
    one,
    rejection,
    values,
)

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
    assert one(decoder("a jsonb", "format = 'csv'"), b'"{""k"": [1, 2.50]}"') == '{"k": [1, 2.50]}'


def test_extra_csv_fields_can_be_ignored():
    assert values(decoder("a int, b int", "format = 'csv', unknown_fields = 'ignore'"), b"1,2,3,4") == (1, 2)


# --- debezium -------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["c", "r"])
def test_a_debezium_insert_or_snapshot_read_inserts_the_after_row(op):
    row = {"id": 1, "name": "x", "at": "2026-11-22T10:00:00Z"}
    expected = (INSERT, (1, "x", datetime(2026, 11, 22, 10, tzinfo=UTC)))
    assert DEBEZIUM_DECODER.decode(None, change(op, before={"id": 9}, after=row), 0) == expected


def test_a_debezium_update_replaces_its_keys_row_with_the_after_row():
    row = {"id": 1, "name": "y", "at": "2026-11-22T10:00:00Z"}
    expected = (1, "y", datetime(2026, 11, 22, 10, tzinfo=UTC))
    assert DEBEZIUM_DECODER.decode(None, change("u", before=None, after=row), 0) == (REPLACE, expected)
    # In a batch: the key's row deleted (the engine takes away the values it stored), then the new one.
    batch = DEBEZIUM_DECODER.decode_batch([Record(change("u", before={"id": 1, "name": "x"}, after=row))])
    assert (batch.ops, list(zip(*batch.columns, strict=True))) == ([DELETE, INSERT], [expected, expected])
    assert batch.ops == DEBEZIUM_DECODER.decode_each([Record(change("u", after=row))]).ops


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
