"""What the decoders accept, PostgreSQL takes, and they judge values as PostgreSQL does.

- Numbers: for JSON number texts at and past every bound, a column accepts exactly those
  PostgreSQL's input takes for its type, and holds the same value.
- Any record: the values decode_batch accepts (tests/unit/test_decoding_fuzz.py's adversarial
  records) pass through PostgreSQL's array input, as the engine sends them.
- CHECK and DEFAULT: each supported kind of expression, evaluated by the decoder and by PostgreSQL
  over random values, gives the same result (or fails in both).
- Debezium updates: decoded changes applied by the engine keep a view equal to the table.

All of it in transactions rolled back, or in a throwaway schema.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.decoding.checks import compile_check, compile_default
from pipelines.cv.decoding.expressions import EvalError
from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.decoding.values import json_converter
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import Check, DefinitionError
from pipelines.cv.sqltext.arrays import array_literal, column_literals
from pipelines.runtime.events import InvalidEvent
from tests.integration.conftest import throwaway_views, unique
from tests.unit.decoding_helpers import Record, change, stream
from tests.unit.test_decoding_fuzz import DECODERS, EDGE_NUMBERS, STREAMS, records

# A cast PostgreSQL may refuse, answered without an error: the whole list in one statement.
# A type with a scale (numeric(5, 2)) rounds to it: decoding refuses a number that needs rounding
# (not the value the producer meant), so it counts as taken only when it needs none.
ACCEPTS = """
CREATE FUNCTION pg_temp.accepts(value text, type text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    exact boolean;
BEGIN
    IF type LIKE 'numeric(%' THEN
        EXECUTE format('SELECT %L::%s = %L::numeric', value, type, value) INTO exact;
        RETURN exact;
    END IF;
    EXECUTE format('SELECT %L::%s', value, type);
    RETURN true;
EXCEPTION WHEN others THEN
    RETURN false;
END $$
"""
TYPES = {
    "smallint": "smallint",
    "integer": "integer",
    "bigint": "bigint",
    "numeric": "numeric",
    "numeric(5, 2)": "numeric(5, 2)",
    "double precision": "double precision",
    "real": "real",
    "jsonb": "jsonb",
}


@pytest.fixture(scope="module")
def conn(pg):
    with pg("sv_owner", autocommit=True) as connection:
        connection.execute(ACCEPTS)
        yield connection


def decoded(declared: str, number: bytes) -> object:
    """The column's value of `{"a": number}`, or the InvalidEvent rejecting it."""
    try:
        result = StreamDecoder(stream(f"a {declared}")).decode(None, b'{"a": ' + number + b"}", 0)
    except InvalidEvent as e:
        return e
    assert result is not None
    return result[1][0]


def number_texts() -> list[bytes]:
    rng = random.Random(7)
    texts = list(EDGE_NUMBERS)
    for _ in range(300):
        whole = rng.choice(["0", "1", "9" * rng.randint(1, 40), str(rng.randrange(10**6))])
        fraction = rng.choice(["", "." + "0" * rng.randint(0, 30) + str(rng.randrange(10**6))])
        exponent = rng.choice(["", f"e{rng.randint(-400, 400)}", f"E+{rng.randint(0, 40)}", f"e-{rng.randint(0, 60)}"])
        texts.append(f"{rng.choice(['', '-'])}{whole}{fraction}{exponent}".encode())
    for bound in (131_072, 16_383, 1_073_741_823, 308, 324, 38, 45):  # numeric's, double's and real's
        for delta in (-1, 0, 1):
            texts += [f"1e{bound + delta}".encode(), f"1e-{bound + delta}".encode(), f"0.5e-{bound + delta}".encode()]
            texts += [f"0e{bound + delta}".encode(), f"0e-{bound + delta}".encode(), f"1.0e-{bound + delta}".encode()]
    return texts


@pytest.mark.parametrize("declared", sorted(TYPES))
def test_a_column_accepts_exactly_the_numbers_postgresql_takes_for_its_type(conn, declared):
    texts = number_texts()
    verdicts = [decoded(declared, text) for text in texts]
    strings = [text.decode() for text in texts]
    taken = [
        row[0]
        for row in conn.execute(
            "SELECT pg_temp.accepts(v, %s) FROM unnest(%s::text[]) WITH ORDINALITY AS x(v, i) ORDER BY i",
            (TYPES[declared], strings),
        ).fetchall()
    ]
    wrong = [
        (s[:40], v.reason if isinstance(v, InvalidEvent) else "accepted", t)
        for s, v, t in zip(strings, verdicts, taken, strict=True)
        if isinstance(v, InvalidEvent) == t and not (isinstance(v, InvalidEvent) and v.reason == "wrong_type")
    ]
    assert wrong == []
    # A JSON number the column refuses as a type (1e2 for bigint) PostgreSQL may still cast: not a range question.
    accepted = [(s, v) for s, v in zip(strings, verdicts, strict=True) if not isinstance(v, InvalidEvent)]
    kind = stream(f"a {declared}").columns[0].kind
    same = conn.execute(
        f"SELECT bool_and(v::{TYPES[declared]} = d) FROM unnest(%s::text[], %s::{TYPES[declared]}[]) AS x(v, d)",
        ([s for s, _ in accepted], array_literal([v for _, v in accepted], kind)),
    ).fetchone()[0]
    assert same in (True, None)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["json", "ignoring", "debezium"]).flatmap(lambda f: st.tuples(st.just(f), st.lists(records(f)))))
def test_postgresql_takes_every_value_the_decoders_accept(conn, case):
    format_, batch = case
    columns = STREAMS[format_].columns
    decoded_batch = DECODERS[format_].decode_batch(batch)
    literals = column_literals(decoded_batch.columns, columns)
    casts = ", ".join(f"%s::{column.type}[]" for column in columns)
    with conn.transaction(force_rollback=True):
        conn.execute(f"SELECT {casts}", literals)


# --- CHECK and DEFAULT -----------------------------------------------------------------------------

ROW = {
    "a": "bigint",
    "b": "integer",
    "c": "smallint",
    "n": "numeric",
    "x": "double precision",
    "r": "real",
    "t": "text",
    "v": "varchar(8)",
    "f": "boolean",
}
CHECKS = [
    "a > 0",
    "a + b < c",
    "a - b >= 0",
    "a * c <> 7",
    "a / b = 2",
    "a % b = 1",
    "b / c > 0",
    "c % 3 = 0",
    "b * b > c",
    "c * c > 100",
    "c + c > 0",
    "-a < 5",
    "+b > 0",
    "n * n > 1",
    "n + 0.5 = a",
    "n - a < 0.25",
    "n BETWEEN -1 AND 1",
    "a::numeric + n > 0",
    "a::numeric > n",
    "b::bigint * 2 > a",
    "a::double precision / 2 > x",
    "x / 3 >= 0.1",
    "x * x < 1e10",
    "x + a > 0",
    "r > 0.1",
    "r = 0.5",
    "r < x",
    "n > x",
    "t = 'x'",
    "t <> v",
    "lower(t) = t",
    "upper(t) = t",
    "upper(v) = lower(v)",
    "length(t) > 3",
    "char_length(v) <= 2",
    "character_length(upper(t)) = length(t)",
    "upper(lower(t)) = upper(t)",
    "lower(t) IN ('i', 'ss', 'ß', '\u03c3')",
    "t IN ('a', 'b', 'ß')",
    "a IN (1, 2, 3)",
    "a NOT IN (1, 2)",
    "a BETWEEN b AND c",
    "a NOT BETWEEN 1 AND 10",
    "NOT (a IS NULL)",
    "t IS NULL OR f",
    "f AND a > 0",
    "f = true",
    "NOT f",
    "a IS NOT NULL AND x IS NULL",
    "length(t) + b > 10",
]
CASED = "ßﬁİiI\u0131\u03a3\u03c3\u03c2\u1fb3\u1fbc\u01c5"  # where upper() and lower() differ most
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00") | st.sampled_from(list(CASED)), max_size=6)
VALUES = {
    "a": st.integers(-(2**63), 2**63 - 1) | st.integers(-20, 20),
    "b": st.integers(-(2**31), 2**31 - 1) | st.integers(-20, 20),
    "c": st.integers(-(2**15), 2**15 - 1) | st.integers(-5, 5),
    "n": st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-(10**6), max_value=10**6),
    "x": st.floats(allow_nan=False, allow_infinity=False) | st.floats(-100, 100),
    "r": st.floats(allow_nan=False, allow_infinity=False, width=32) | st.sampled_from([0.5, 0.10000000149011612]),
    "t": TEXT,
    "v": TEXT,
    "f": st.booleans(),
}
COLUMNS = {name: (i, stream(f"{name} {kind}").columns[0]) for i, (name, kind) in enumerate(ROW.items())}
COMPILED = [compile_check(Check(None, sql), COLUMNS, "differential") for sql in CHECKS]


def in_python(check, row: list) -> object:
    try:
        return check.test(*(row[i] for i in check.columns))
    except EvalError:
        return "error"


def in_postgres(conn: psycopg.Connection, sql: str, row: list) -> object:
    params = ", ".join(f"%s::{kind} AS {name}" for name, kind in ROW.items())
    try:
        with conn.transaction():
            return conn.execute(f"SELECT ({sql.replace('%', '%%')}) FROM (SELECT {params}) AS s", row).fetchone()[0]
    except psycopg.DataError:  # division by zero, out of range
        return "error"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries(VALUES).map(lambda v: [v[name] for name in ROW]), st.sets(st.sampled_from(list(ROW))))
def test_every_check_is_judged_as_postgresql_judges_it(conn, row, nulls):
    row = [None if name in nulls else value for name, value in zip(ROW, row, strict=True)]
    results = [
        (sql, in_python(check, row), in_postgres(conn, sql, row)) for sql, check in zip(CHECKS, COMPILED, strict=True)
    ]
    assert [r for r in results if r[1] != r[2]] == []


DEFAULTS = st.one_of(
    st.tuples(
        st.just("bigint"), st.builds("{} + {}".format, st.integers(-(2**62), 2**62), st.integers(-(2**62), 2**62))
    ),
    st.tuples(
        st.just("integer"), st.builds("{} * {}".format, st.integers(-(2**16), 2**16), st.integers(-(2**16), 2**16))
    ),
    st.tuples(st.just("smallint"), st.builds("{} / {}".format, st.integers(-(2**15), 2**15), st.integers(-3, 3))),
    st.tuples(st.just("integer"), st.builds("{} % {}".format, st.integers(-(2**31), 2**31), st.integers(-9, 9))),
    st.tuples(st.just("numeric"), st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str)),
    # No more decimals than the scale: PostgreSQL would round 0.001 to 0.00, decoding refuses to.
    st.tuples(st.just("numeric(6, 2)"), st.decimals(allow_nan=False, allow_infinity=False, places=2).map(str)),
    st.tuples(
        st.sampled_from(["double precision", "real"]), st.floats(allow_nan=False, allow_infinity=False).map(repr)
    ),
    st.tuples(
        st.sampled_from(["double precision", "real"]),
        st.builds("{} / {}".format, st.floats(-1e6, 1e6), st.integers(-3, 3)),
    ),
    st.tuples(
        st.just("text"),
        st.builds(
            lambda f, s: f"{f}('{s}')", st.sampled_from(["upper", "lower"]), TEXT.map(lambda s: s.replace("'", "''"))
        ),
    ),
    st.tuples(st.just("integer"), TEXT.map(lambda s: "length('{}')".format(s.replace("'", "''")))),
    st.tuples(st.just("boolean"), st.sampled_from(["true", "false", "1 < 2", "NOT true", "NULL"])),
    st.tuples(st.just("timestamptz"), st.sampled_from(["'2026-11-22T10:00:00Z'", "'2026-11-22T10:00:00.5+01:30'"])),
    st.tuples(st.just("date"), st.sampled_from(["'2026-11-22'::date", "'2024-02-29'"])),
    st.tuples(st.just("uuid"), st.just("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'")),
    st.tuples(
        st.just("jsonb"), st.sampled_from(["'{\"a\": [1.50, 1e400, null]}'", "'\"x\"'", "'[1, 18446744073709551617]'"])
    ),
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(DEFAULTS)
def test_every_default_is_the_value_postgresql_computes(conn, case):
    declared, expression = case
    column = dataclasses.replace(stream(f"d {declared}").columns[0], default=expression)
    try:
        value: object = compile_default(column, json_converter(column, "out_of_range")[1], (), "differential")()
    except DefinitionError as e:
        if "not supported" in str(e):
            return  # refused at definition time, saying so: never judged differently
        value = "error"
    try:
        with conn.transaction():
            conn.execute(f"SELECT ({expression.replace('%', '%%')})::{column.type}", ())
        failed = False
    except psycopg.DataError:  # out of range, division by zero
        failed = True
    assert failed == (value == "error"), (declared, expression, value)
    if not failed:
        # The decoder's value, sent as the engine sends it (an array literal), is PostgreSQL's.
        same = conn.execute(
            f"SELECT ({expression.replace('%', '%%')})::{column.type} IS NOT DISTINCT FROM (%s::{column.type}[])[1]",
            (array_literal([value], column.kind),),
        ).fetchone()[0]
        assert same, (declared, expression, value)


# --- Debezium updates through the engine ---------------------------------------------------------


@pytest.fixture(scope="module")
def items(stack, pg):
    """A Debezium stream keyed by id, with a view of its rows per val."""
    name = unique("dbz")
    stream_name = f"{name}_rows"
    definitions = f"""
        CREATE STREAM {stream_name} (id bigint NOT NULL, val text NOT NULL, n int NOT NULL)
            WITH (topic = '{stream_name}', format = 'debezium', key = 'id');
        CREATE CONTINUOUS VIEW {name}.per_val AS
            SELECT val, count(*) AS n_rows, sum(n) AS total FROM {stream_name} GROUP BY val;
        """
    with throwaway_views(pg, name, [stream_name], definitions), pg("sv_owner", autocommit=True) as conn:
        yield conn, catalog.load_streams(conn)[stream_name], f"{name}.per_val"


EXAMPLES = itertools.count(random.SystemRandom().randrange(10**12))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(st.sampled_from("cud"), st.integers(0, 5), st.sampled_from("ab"), st.integers(0, 9)), max_size=30
    ),
    st.lists(st.integers(0, 30), max_size=3),
)
def test_debezium_updates_applied_by_the_engine_keep_a_view_equal_to_the_table(items, changes, cuts):
    """Creates, updates of the non-key columns and deletes, in any batching: the view is the table's GROUP BY.

    One transaction per batch, as the runner commits them; each example has its own ids and vals.
    """
    conn, declared, view = items
    decoder, maintainer = StreamDecoder(declared), StreamMaintainer(declared.name)
    table: dict[int, tuple[str, int]] = {}
    example = unique("x")
    offset = next(EXAMPLES) * 100  # hypothesis seeds `random` alike for every example
    events = []
    for op, key, val, n in changes:
        row = {"id": offset + key, "val": f"{example}_{val}", "n": n}
        if op == "d" and key in table:
            events.append(Record(change("d", before={"id": offset + key})))
            del table[key]
        elif op == "u" and key in table:
            events.append(Record(change("u", before=None, after=row)))
            table[key] = (row["val"], n)
        elif key not in table:
            events.append(Record(change("c", after=row)))
            table[key] = (row["val"], n)
    bounds = sorted({0, len(events), *(c for c in cuts if c <= len(events))})
    for start, end in itertools.pairwise(bounds):
        batch = decoder.decode_batch(events[start:end])
        with conn.transaction():
            maintainer.apply(conn, batch.ops, batch.columns)
    query = f"SELECT val, n_rows, total FROM {view} WHERE val LIKE %s AND n_rows > 0 ORDER BY val"
    rows = conn.execute(query, (f"{example}_%",)).fetchall()
    counts: Counter = Counter()
    totals: Counter = Counter()
    for val, n in table.values():
        counts[val] += 1
        totals[val] += n
    assert rows == [(val, counts[val], totals[val]) for val in sorted(counts)]


def test_postgresql_takes_jsonb_as_deep_as_decoding_reads(conn):
    dec = StreamDecoder(stream("j jsonb"))
    deepest = b"[" * 499 + b"]" * 499  # inside the event's object: 500 levels
    batch = dec.decode_batch([Record(b'{"j": ' + deepest + b"}")])
    literal = array_literal(batch.columns[0], "jsonb")
    assert conn.execute("SELECT (%s::jsonb[])[1] = %s::jsonb", (literal, deepest.decode())).fetchone() == (True,)
