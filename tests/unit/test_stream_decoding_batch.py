"""`decode_batch` is `decode`, faster: the same results on any mix of good and bad records."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import msgspec
from confluent_kafka import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from pipelines.cv.decoding.stream_decoder import DecodedBatch
from pipelines.runtime.events import DELETE, INSERT
from tests.unit.decoding_helpers import (
    ACTIONS,
    DEBEZIUM_DECODER,
    KAFKA_TS,
    KAFKA_TS_MS,
    Record,
    change,
    decoder,
)

# --- decode_batch is decode, faster ----------------------------------------------------------------


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
    assert comparable(batch) == comparable(dec.decode_each(records))


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


def test_a_field_given_twice_is_rejected_whatever_its_values():
    # JSON parsers keep the last of a key given twice: {"action": "unlike", "action": "like"} would be a like.
    dec = decoder(
        "a int NOT NULL, b int", "key = 'a', action_field = 'op', insert_actions = 'add', delete_actions = 'del'"
    )
    records = [
        Record(b'{"a": "x", "a": 1}'),
        Record(b'{"a": 2}'),
        Record(b'{"a": 3, "op": "del", "op": "add"}'),
        Record(b'{"a": 4, "\\u0061": 5}'),  # an escaped key is the same key
        Record(b'{"a": 5, "b": {"a": 1, "a": 2}}'),  # b is not an object column: wrong_type, not a repeat
        Record(b'{"a": 6, "note": "\\"a\\": 1"}'),  # the name inside a string is no key
    ]
    batch = dec.decode_batch(records)
    assert comparable(batch) == comparable(dec.decode_each(records))
    assert [(i, e.reason) for i, e in batch.rejected] == [
        (0, "duplicate_field"),
        (2, "duplicate_field"),
        (3, "duplicate_field"),
        (4, "wrong_type"),
        (5, "unknown_field"),
    ]


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
    mistake = draw(st.sampled_from(["none"] * 4 + ["value", "missing", "extra", "key", "junk", "timestamp", "twice"]))
    if mistake == "value":
        name = draw(st.sampled_from(sorted(INVALID)))
        event[name] = draw(INVALID[name])
    elif mistake == "missing":
        del event["id"]
    elif mistake == "extra":
        event["extra"] = 1
    elif mistake == "twice":  # a field given twice, written out by hand (a dict cannot hold it)
        name = draw(st.sampled_from(["id", "n", "op", "extra"]))
        again = ENCODE({name: draw(VALID.get(name, st.just(1)))})[1:-1]
        value = ENCODE(event)
        return Record(value[:-1] + (b", " if len(value) > 2 else b"") + again + b"}", str(event.get("id")).encode())
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
    assert comparable(dec.decode_batch(batch)) == comparable(dec.decode_each(batch))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([b'{"n": 1, "s": "a"}', b"2,b", b"3,", b"x,y", b'"4","a""b"', b"5,c,d", b""]), max_size=20)
)
def test_decode_batch_of_csv_gives_what_decode_gives(values_):
    dec = decoder("n int NOT NULL, s text", "format = 'csv'")
    batch = [Record(v) for v in values_]
    assert comparable(dec.decode_batch(batch)) == comparable(dec.decode_each(batch))


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
    assert comparable(decoded) == comparable(MIX_DECODER.decode_each(batch))
