"""No input stops the runner: every record decodes to values arrays.py renders, or is rejected with a reason.

Random and adversarial JSON (numbers at and past every type's bounds, integers past the 4300 digits
int() reads, nesting around the 500-level limit, NUL and surrogate escapes, invalid UTF-8) for a
stream with a column of every type. "undecodable" is the runner's reason for a decoder that raised:
a bug, never an answer. tests/integration/test_decoded_into_postgres.py sends what is accepted
through PostgreSQL's array input.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv.decoding.json_text import MAX_DEPTH
from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.sqltext.arrays import column_literals
from tests.unit.decoding_helpers import Record, stream

COLUMNS = {
    "i8": "bigint",
    "i4": "integer",
    "i2": "smallint",
    "num": "numeric",
    "num52": "numeric(5, 2)",
    "f8": "double precision",
    "f4": "real",
    "b": "boolean",
    "t": "text",
    "vc": "varchar(3)",
    "ts": "timestamptz",
    "d": "date",
    "u": "uuid",
    "j": "jsonb",
}
DECLARED = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
STREAMS = {
    "json": stream(DECLARED, "max_event_bytes = 200000"),
    "ignoring": stream(DECLARED, "unknown_fields = 'ignore', max_event_bytes = 200000"),
    "debezium": stream(DECLARED + ", id bigint NOT NULL", "format = 'debezium', key = 'id', max_event_bytes = 200000"),
}
DECODERS = {name: StreamDecoder(s) for name, s in STREAMS.items()}

EDGE_NUMBERS = [
    b"0",
    b"-0",
    b"-0.0",
    b"0e-16384",
    b"0e999999999",
    b"0e1073741823",
    b"1e-400",
    b"1e400",
    b"1e-16383",
    b"1.0e-16383",
    b"1e131071",
    b"1e131072",
    b"2.5e-324",
    b"2.4703282292062327e-324",
    b"4.9e-324",
    b"1.7976931348623157e308",
    b"1.7976931348623159e308",
    b"1.4e-45",
    b"7e-46",
    b"7.006492321624086e-46",  # about half the least real
    b"3.4028235e38",
    b"3.4028235677973366e38",  # halfway between the greatest real and 2**128
    b"3.40282357e38",
    b"0.1000000000000000055511151231257827",
    b"12345678901234567.5",
    b"32767",
    b"32768",
    b"2147483648",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551617",
    b"999.995",
    b"1" * 4300,
    b"1" * 4301,
    b"-" + b"9" * 5000,
    b"0." + b"0" * 16383 + b"1",
    b"1" * 20 + b"." + b"5" * 20 + b"e-9999",
    b"1e9223372036854775808",
    b"1253453123456789",
    b"253402300799999",
    b"253402300800000",
]
EDGE_STRINGS = [
    b'""',
    b'"\\u0000"',
    b'"a\\u0000"',
    b'"\\\\u0000"',
    b'"\\ud800"',
    b'"\\udc00"',
    b'"\\ud83d\\ude00"',
    b'"\\ud800\\u0041"',
    b'"\xff"',
    b'"\xed\xa0\x80"',
    b'"\xf0\x9f\x98\x80"',
    b'"abcd"',
    b'"NULL"',
    b'"a,b{c}\\"\\\\"',
    b'"2026-11-22T10:00:00Z"',
    b'"2026-11-22T10:00:00.123456+01:00"',
    b'"0001-01-01"',
    b'"9999-12-31"',
    b'"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"',
    b'"\\u001f"',
    b'"\x1f"',
]


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


EDGE_VALUES = [
    b"null",
    b"true",
    b"false",
    b"[]",
    b"{}",
    b'{"\\u0000": 1}',
    b'{"a": 1, "a": 2}',
    nested(MAX_DEPTH - 2),  # the event's own object is one more level
    nested(MAX_DEPTH - 1),
    nested(MAX_DEPTH),
    nested(1100),
    b'{"k":' * 600 + b"1" + b"}" * 600,
    nested(2, b'"[[[[[["'),
    b"NaN",
    b"Infinity",
    b"01",
    b"1.",
    b"[1,]",
    b"[1 2]",
]

SCALAR = (
    st.sampled_from(EDGE_NUMBERS + EDGE_STRINGS + EDGE_VALUES)
    | st.integers().map(lambda n: str(n).encode())
    | st.floats(allow_nan=False, allow_infinity=False).map(lambda x: repr(x).encode())
    | st.builds(
        lambda minus, whole, fraction, exponent: (
            b"%s%d%s%s" % (b"-" if minus else b"", whole, b"" if fraction is None else b".%s" % fraction, exponent)
        ),
        st.booleans(),
        st.integers(0, 10**40),
        st.none() | st.integers(0, 10**40).map(lambda n: str(n).encode()),
        st.just(b"") | st.integers(-99999, 99999).map(lambda e: b"e%d" % e),
    )
    | st.text(max_size=8).map(lambda s: b'"' + s.encode("utf-8", "surrogateescape").replace(b'"', b"") + b'"')
)
JSON_VALUE = st.recursive(
    SCALAR,
    lambda children: (
        st.lists(children, max_size=3).map(lambda items: b"[" + b",".join(items) + b"]")
        | st.lists(st.tuples(st.sampled_from([b'"k"', b'"\\u0000"', b'"i8"']), children), max_size=3).map(
            lambda pairs: b"{" + b",".join(k + b":" + v for k, v in pairs) + b"}"
        )
    ),
    max_leaves=8,
)


@st.composite
def records(draw: Any, format_: str) -> Record:
    names = [*COLUMNS, "id"] if format_ == "debezium" else list(COLUMNS)
    fields = [
        b'"' + name.encode() + b'":' + draw(JSON_VALUE)
        for name in names
        if draw(st.integers(0, 2)) or name == "id"  # each column present two times in three
    ]
    if draw(st.booleans()):
        fields.append(b'"extra":' + draw(JSON_VALUE))
    row = b"{" + b",".join(fields) + b"}"
    if format_ != "debezium":
        return Record(row)
    op = draw(st.sampled_from([b'"c"', b'"u"', b'"d"', b'"r"']))
    image = b'"before"' if op == b'"d"' else b'"after"'
    return Record(b'{"op":' + op + b"," + image + b":" + row + b',"source":{"ts_ms":1700000000000}}')


def check(format_: str, batch: list[Record]) -> None:
    dec = DECODERS[format_]
    decoded = dec.decode_batch(batch)  # raising here is what the runner calls undecodable
    each = dec.decode_each(batch, undecodable="undecodable")
    assert [(i, e.reason) for i, e in decoded.rejected] == [(i, e.reason) for i, e in each.rejected]
    assert (decoded.ops, decoded.columns) == (each.ops, each.columns)
    assert all(e.reason != "undecodable" for _, e in decoded.rejected)
    literals = column_literals(decoded.columns, STREAMS[format_].columns)
    assert all(literal.startswith("{") and literal.endswith("}") for literal in literals)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(["json", "ignoring"]).flatmap(lambda f: st.tuples(st.just(f), st.lists(records(f), max_size=8))))
def test_every_json_record_is_decoded_to_renderable_values_or_rejected_with_a_reason(case):
    check(*case)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(records("debezium"), max_size=6))
def test_every_debezium_change_is_decoded_to_renderable_values_or_rejected_with_a_reason(batch):
    check("debezium", batch)


def test_each_edge_value_in_each_column_is_decoded_or_rejected_with_a_reason():
    for name in COLUMNS:
        batch = [Record(b'{"' + name.encode() + b'":' + value + b"}") for value in EDGE_NUMBERS + EDGE_STRINGS]
        batch += [Record(b'{"' + name.encode() + b'":' + value + b"}") for value in EDGE_VALUES]
        check("json", batch)
