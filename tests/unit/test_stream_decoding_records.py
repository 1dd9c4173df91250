"""Decoding generated from a stream's declaration: record keys, actions, unknown fields, size limits, nesting.

Read by `decode`, the reference (see test_stream_decoding_types.py).
"""

from __future__ import annotations

import orjson
import pytest

from pipelines.runtime.events import DELETE, INSERT
from tests.unit.decoding_helpers import (
    ACTIONS,
    Record,
    decoder,
    one,
    rejection,
    values,
)

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
