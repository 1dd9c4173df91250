"""Stream columns of the types PostgreSQL reads (kind input), as decoding keeps them: the field's JSON text.

Decoding does not read timestamp, interval, json, money, bit, arrays, enums ... itself: it keeps
each value as its JSON text, as written, for PostgreSQL's input to type (pipelines.cv.sqltext.types),
and asks PostgreSQL, through the check it is given, which values its input refuses. Here the check
is a stand-in; tests/integration/test_stream_input_types.py asks PostgreSQL.
"""

from __future__ import annotations

import json

import pytest

from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.model import DefinitionError
from tests.unit.decoding_helpers import Record, encoded, one, rejection, stream

COLUMNS = "id bigint NOT NULL, ts timestamp, j json, a int[], m money NOT NULL"


def batch(dec: StreamDecoder, events: list) -> tuple[list[int], list[list], dict[int, tuple[str, str]]]:
    decoded = dec.decode_batch([Record(encoded(e) if not isinstance(e, bytes) else e) for e in events])
    return decoded.ops, decoded.columns, {i: (e.reason, e.detail) for i, e in decoded.rejected}


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        (b'"2026-01-01 10:00"', '"2026-01-01 10:00"'),
        (b"12.50", "12.50"),  # a number as written: money's input reads 12.50
        (b'{"b": [1, 2.0], "a": null}', '{"b": [1, 2.0], "a": null}'),
        (b"[1,  2]", "[1,  2]"),
        (b"true", "true"),
    ],
)
def test_a_value_is_kept_as_its_json_text_as_written_by_the_reference_and_the_fast_path(written, kept):
    dec = StreamDecoder(stream("x interval"))
    value = b'{"x": ' + written + b"}"
    assert one(dec, value) == kept
    ops, columns, rejected = batch(dec, [value, b'{"x": null}', b"{}"])
    assert (ops, columns, rejected) == ([1, 1, 1], [[kept, None, None]], {})


def test_null_and_absence_are_null_and_a_not_null_column_requires_a_value():
    dec = StreamDecoder(stream(COLUMNS))
    assert one(StreamDecoder(stream("ts timestamp")), {"ts": None}) is None
    assert rejection(dec, {"id": 1}).reason == "missing_field"
    assert rejection(dec, {"id": 1, "m": None}).detail == "m must be a JSON value PostgreSQL reads as money, got null"


def test_csv_fields_are_given_to_the_input_as_text_and_a_json_field_as_json():
    dec = StreamDecoder(stream("ts timestamp, j json, n int", "format = 'csv'"))
    assert dec.decode(None, b'2026-01-01 10:00,"{""a"": 1}",3', 0) == (1, ('"2026-01-01 10:00"', '{"a": 1}', 3))
    assert rejection(dec, b"2026-01-01,{nope,3").reason == "wrong_type"


def refusing(refused: set[str]):
    """A stand-in for PostgreSQL: refuses these texts; records each question."""
    asked: list[tuple[str, list[str]]] = []

    def check(type_, texts):
        asked.append((type_, list(texts)))
        return {i: f"cannot read {t}" for i, t in enumerate(texts) if t in refused}

    return check, asked


def test_records_whose_value_postgresql_refuses_are_rejected_with_its_message_the_others_kept_in_order():
    check, asked = refusing({'"soon"', '"{x}"'})
    dec = StreamDecoder(stream(COLUMNS), input_check=check)
    events = [
        {"id": 1, "ts": "2026-01-01", "m": 1},
        {"id": 2, "ts": "soon", "m": 2},
        {"id": 3, "a": "{x}", "ts": "soon", "m": 3},  # one rejection per record: its first column's
        {"id": 4, "m": 4},
        {"id": "five", "m": 5},  # decoding's own rejection comes first
    ]
    ops, columns, rejected = batch(dec, events)
    assert ops == [1, 1]
    assert columns[0] == [1, 4]
    assert rejected == {
        1: ("invalid_input", 'ts "soon" is not of type timestamp: cannot read "soon"'),
        2: ("invalid_input", 'ts "soon" is not of type timestamp: cannot read "soon"'),
        4: ("wrong_type", 'id must be a JSON integer, got "five"'),
    }
    # Each column asked once per batch, its present values only.
    assert asked == [
        ("timestamp", ['"2026-01-01"', '"soon"', '"soon"']),
        ("integer[]", ['"{x}"']),
        ("money", ["1", "2", "3", "4"]),
    ]


def test_a_refused_debezium_update_takes_both_its_changes_away():
    check, _ = refusing({'"never"'})
    dec = StreamDecoder(
        stream("id bigint NOT NULL, ts timestamp", "format = 'debezium', key = 'id'"), input_check=check
    )
    update = {"op": "u", "before": {"id": 1}, "after": {"id": 1, "ts": "never"}, "source": {"ts_ms": 1}}
    insert = {"op": "c", "after": {"id": 2, "ts": "2026-01-01"}, "source": {"ts_ms": 1}}
    ops, columns, rejected = batch(dec, [update, insert, {**update, "after": {"id": 3, "ts": "2026-01-02"}}])
    assert ops == [1, -1, 1]
    assert columns == [[2, 3, 3], ['"2026-01-01"', '"2026-01-02"', '"2026-01-02"']]
    assert set(rejected) == {0}


def test_without_a_check_the_values_are_kept_unchecked():
    ops, columns, rejected = batch(StreamDecoder(stream("ts timestamp")), [{"ts": "soon"}])
    assert (ops, columns, rejected) == ([1], [['"soon"']], {})


def test_a_default_is_a_string_the_input_reads_as_an_events_field_and_a_check_cannot_read_the_column():
    dec = StreamDecoder(stream("id int, iv interval DEFAULT '1 day'"))
    assert dec.decode(None, b'{"id": 1}', 0) == (1, (1, json.dumps("1 day")))
    with pytest.raises(DefinitionError, match="iv is interval, which PostgreSQL reads, not decoding"):
        StreamDecoder(stream("iv interval CHECK (iv > '1 hour')"))
    with pytest.raises(DefinitionError, match="a default of a interval column is a string"):
        StreamDecoder(stream("iv interval DEFAULT 5"))
