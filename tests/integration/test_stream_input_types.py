"""Stream columns of the types PostgreSQL reads: timestamp, interval, money, bit, json, inet, oid, arrays, enums...

A stream declares them like any column; an event carries each as a JSON value, typed by PostgreSQL's
own input as json_to_record types it (pipelines.cv.sqltext.types): a string through the type's
input function, an array into an array type, an object into a composite type. A value the input
refuses makes its record a dead letter `invalid_input` with PostgreSQL's message, and only that
record.

The oracle: each view answers what PostgreSQL's own aggregate answers over the same rows (the
view's SELECT over a temporary table of the stream's current rows, typed from the same events by
json_populate_recordset), after inserts and retractions, whatever the batches.
"""

from __future__ import annotations

import itertools
import json
import re
from datetime import timedelta

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.catalog.stream_types import PostgresInputCheck
from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from pipelines.cv.plans import declared_streams
from tests.integration.conftest import start_runner, stop_runner, throwaway_views, unique, wait_for

pytestmark = pytest.mark.integration

TYPES = (
    "ts timestamp, iv interval, m money, bt bit(4), j json, ip inet, o oid, a int[], e {schema}.mood, c {schema}.pair"
)
# Over a keyed stream: what forgets a retracted row, over each type PostgreSQL aggregates so.
KEYED_VIEW = """
    SELECT g, count(*) AS n, sum(m) AS sum_m, sum(iv) AS sum_iv, avg(iv) AS avg_iv,
        min(ts) AS min_ts, max(ts) AS max_ts, min(iv) AS min_iv, max(m) AS max_m, min(ip) AS min_ip, max(o) AS max_o,
        min(e) AS min_e, max(a) AS max_a, count(bt) AS n_bt, count(j) AS n_j, count(c) AS n_c,
        count(DISTINCT ts) AS distinct_ts
    FROM {stream} GROUP BY g"""
# Grouped by the new types themselves (json by its text: json has no equality).
GROUPS_VIEW = "SELECT e, (j)::text AS jt, count(*) AS n, count(c) AS n_c FROM {stream} GROUP BY e, (j)::text"
# Over an append-only stream: the aggregates kept as transition states too.
APPEND_VIEW = """
    SELECT g, bit_or(bt) AS or_bt, bit_and(bt) AS and_bt, sum(m) AS sum_m, avg(iv) AS avg_iv, max(e) AS max_e,
        min(a) AS min_a, max(ts) AS max_ts, min(ip) AS min_ip
    FROM {stream} GROUP BY g"""


@pytest.fixture(scope="module")
def streams(stack, pg):
    schema = unique("intypes")
    keyed, append = f"{schema}_keyed", f"{schema}_events"
    types = TYPES.format(schema=schema)
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TYPE {schema}.mood AS ENUM ('sad', 'ok', 'happy')")
        conn.execute(f"CREATE TYPE {schema}.pair AS (x int, y text)")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_writer, sv_reader")
    definitions = f"""
        CREATE STREAM {keyed} (g bigint, k bigint, {types}) WITH (topic = '{keyed}', key = 'g, k');
        CREATE STREAM {append} (g bigint, {types}) WITH (topic = '{append}');
        CREATE CONTINUOUS VIEW {schema}.typed AS {KEYED_VIEW.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {schema}.grouped AS {GROUPS_VIEW.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {schema}.states AS {APPEND_VIEW.format(stream=append)};
    """
    with throwaway_views(pg, schema, [keyed, append], definitions, schema_exists=True):
        yield {"schema": schema, "keyed": keyed, "append": append, "types": types}


@pytest.fixture(scope="module")
def writer(pg, streams):
    with pg("sv_writer", autocommit=True) as conn:
        yield conn


class Record:
    """A Kafka record as the decoder reads it."""

    def __init__(self, event: dict) -> None:
        self._value = json.dumps(event).encode()

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_900_000_000_000)


def decoder(writer, stream: str) -> StreamDecoder:
    return StreamDecoder(declared_streams(writer)[stream], input_check=PostgresInputCheck(lambda: writer))


def apply_events(writer, stream: str, events: list[dict], ops: list[int] | None = None):
    """The events decoded as the runner decodes them and applied in one batch; the records rejected."""
    batch = decoder(writer, stream).decode_batch([Record(e) for e in events])
    if ops is not None:
        batch.ops = [ops[i] for i in range(len(events)) if i not in {r for r, _ in batch.rejected}]
    if batch.ops:
        with writer.transaction():
            StreamMaintainer(stream).apply(writer, batch.ops, batch.columns)
    return batch.rejected


def oracle(writer, streams, stream: str, columns: str, events: list[dict], query: str, order: str):
    """The view's own SELECT over the events in a temporary table named like the stream, typed by PostgreSQL."""
    with writer.transaction(force_rollback=True):
        writer.execute(f"CREATE TEMP TABLE {stream} ({columns}) ON COMMIT DROP")
        writer.execute(
            f"INSERT INTO {stream} SELECT * FROM json_populate_recordset(NULL::{stream}, %s)", (json.dumps(events),)
        )
        return rows(writer, f"SELECT * FROM ({query}) AS q ORDER BY {order}")


def rows(writer, query: str, args=()):
    result = writer.execute(query, args)
    return [d.name for d in result.description], [tuple(r) for r in result]


example = itertools.count(1)
value = st.fixed_dictionaries(
    {},
    optional={
        "ts": st.integers(0, 10**6).map(lambda s: f"2030-01-{1 + s % 28:02d} {s % 24:02d}:{s % 60:02d}:{s % 7:02d}"),
        "iv": st.integers(-(10**5), 10**5).map(lambda s: f"{s} seconds"),
        "m": st.one_of(
            st.integers(-(10**6), 10**6).map(lambda c: c / 100), st.integers(0, 999).map(lambda d: f"${d}.25")
        ),
        "bt": st.integers(0, 15).map(lambda n: format(n, "04b")),
        "j": st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b"]), st.lists(st.integers(0, 2), max_size=2)),
        "ip": st.integers(0, 255).map(lambda n: f"10.0.{n % 3}.{n}"),
        "o": st.integers(0, 2**32 - 1),
        "a": st.lists(st.integers(-5, 5), max_size=3),
        "e": st.sampled_from(["sad", "ok", "happy"]),
        "c": st.fixed_dictionaries({"x": st.integers(-9, 9), "y": st.sampled_from(["p", "q"])}),
    },
)


def current(events: list[tuple[int, dict]]) -> list[dict]:
    """A keyed stream's rows after its inserts and retractions: an insert of a present key is ignored."""
    state: dict[tuple[int, int], dict] = {}
    for op, event in events:
        key = (event["g"], event["k"])
        if op == 1 and key not in state:
            state[key] = event
        elif op == -1:
            state.pop(key, None)
    return list(state.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(
        st.tuples(st.sampled_from([1, 1, 1, -1]), st.integers(0, 2), st.integers(0, 4), value), max_size=25
    ),
    each=st.booleans(),
)
def test_each_new_type_over_a_keyed_stream_equals_postgresql_after_retractions(writer, streams, events, each):
    base = next(example) * 10
    changes = [(op, {"g": base + g, "k": k, **values}) for op, g, k, values in events]
    for batch in [[c] for c in changes] if each else [changes] if changes else []:
        assert apply_events(writer, streams["keyed"], [e for _, e in batch], [op for op, _ in batch]) == []
    state = current(changes)
    groups = [base + g for g in range(3)]
    columns = f"g bigint, k bigint, {streams['types']}"
    query = f"SELECT * FROM ({KEYED_VIEW.format(stream=streams['keyed'])}) AS v WHERE g = ANY(ARRAY{groups}::bigint[])"
    expected = oracle(writer, streams, streams["keyed"], columns, state, query, "g")
    got = rows(writer, f"SELECT * FROM {streams['schema']}.typed WHERE g = ANY(%s) ORDER BY g", (groups,))
    assert got == expected


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.tuples(st.integers(0, 2), value), max_size=25), cuts=st.integers(1, 5))
def test_each_new_type_over_an_append_only_stream_equals_postgresql(writer, streams, events, cuts):
    base = 1_000_000 + next(example) * 10
    inserted = [{"g": base + g, **values} for g, values in events]
    for start in range(0, len(inserted), cuts):
        assert apply_events(writer, streams["append"], inserted[start : start + cuts]) == []
    groups = [base + g for g in range(3)]
    query = (
        f"SELECT * FROM ({APPEND_VIEW.format(stream=streams['append'])}) AS v WHERE g = ANY(ARRAY{groups}::bigint[])"
    )
    expected = oracle(writer, streams, streams["append"], f"g bigint, {streams['types']}", inserted, query, "g")
    got = rows(writer, f"SELECT * FROM {streams['schema']}.states WHERE g = ANY(%s) ORDER BY g", (groups,))
    assert got == expected


def test_a_view_groups_by_an_enum_and_a_json_text_and_counts_composites(writer, streams):
    base = 5_000_000
    events = [
        {"g": base, "k": 1, "e": "ok", "j": {"b": 1, "a": [1, 2]}, "c": {"x": 1, "y": "p"}},
        {"g": base, "k": 2, "e": "ok", "j": {"b": 1, "a": [1, 2]}, "c": {"x": 2, "y": "p"}},
        {"g": base, "k": 3, "e": "happy", "j": "s", "c": "(3,q)"},  # a composite's text form is read too
    ]
    assert apply_events(writer, streams["keyed"], events) == []
    _, got = rows(writer, f"SELECT e::text, jt, n, n_c FROM {streams['schema']}.grouped WHERE n > 0")
    assert ("ok", '{"b": 1, "a": [1, 2]}', 2, 2) in got
    assert ("happy", '"s"', 1, 1) in got


def test_a_value_postgresql_does_not_read_is_rejected_with_its_message_and_the_others_apply(writer, streams):
    base = 6_000_000
    events = [
        {"g": base, "k": 1, "ts": "2030-02-30 10:00", "m": 1},
        {"g": base, "k": 2, "bt": "101"},
        {"g": base, "k": 3, "a": [1, "x"]},
        {"g": base, "k": 4, "e": "angry"},
        {"g": base, "k": 5, "c": {"x": "not a number"}},
        {"g": base, "k": 6, "iv": "forever"},
        {"g": base, "k": 7, "m": "$4.50", "iv": "1 day", "ts": "2030-02-28 10:00", "ip": "10.1.2.3", "o": 7},
    ]
    rejected = {i: (e.reason, e.detail) for i, e in apply_events(writer, streams["keyed"], events)}
    assert set(rejected) == {0, 1, 2, 3, 4, 5}
    assert {reason for reason, _ in rejected.values()} == {"invalid_input"}
    assert rejected[0][1] == (
        'ts "2030-02-30 10:00" is not of type timestamp: date/time field value out of range: "2030-02-30 10:00"'
    )
    assert rejected[1][1] == 'bt "101" is not of type bit(4): bit string length 3 does not match type bit(4)'
    assert rejected[3][1].endswith("invalid input value for enum " + f'{streams["schema"]}.mood: "angry"')
    got = writer.execute(
        f"SELECT n, sum_m, sum_iv, max_ts FROM {streams['schema']}.typed WHERE g = %s", (base,)
    ).fetchone()
    assert got[:3] == (1, "$4.50", timedelta(days=1))


@pytest.mark.parametrize(
    ("declared", "match"),
    [
        ("x nosuchtype", "column x: type nosuchtype does not exist"),
        ("x record", "column x: type record is a pseudo-type"),
        ("x mood", "column x: type mood does not exist"),  # the schema's: the runner must find it too
        ("x bit(3) DEFAULT '10'", "type bit(3): DEFAULT '10': bit string length 2 does not match type bit(3)"),
        ("x interval CHECK (x > '1 day')", "x is interval, which PostgreSQL reads, not decoding: a CHECK cannot"),
    ],
)
def test_a_stream_column_postgresql_cannot_read_as_declared_is_refused_in_one_line(pg, streams, declared, match):
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match=re.escape(match)):
        catalog.define(conn, f"CREATE STREAM {streams['schema']}_bad ({declared}) WITH (topic = 'x')")


def test_grouping_by_json_is_refused_with_what_to_write_instead(pg, streams):
    statement = (
        f"CREATE CONTINUOUS VIEW {streams['schema']}.byjson AS SELECT j, count(*) FROM {streams['keyed']} GROUP BY j"
    )
    refusal = r"j is a json, which has no equality.*write \(j\)::text, or declare the column jsonb$"
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match=refusal) as caught:
        catalog.define(conn, statement)
    assert "\n" not in str(caught.value)


def test_the_runner_dead_letters_an_unreadable_value_and_counts_the_rest(stack, pg, kafka):
    group, schema = unique("it-intypes"), unique("intypesrun")
    stream = f"{schema}_s"
    definitions = f"""
        CREATE STREAM {stream} (url text NOT NULL, ts timestamp, spent money) WITH (consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.per_day AS
            SELECT (ts)::date AS day, count(*) AS n, sum(spent) AS spent FROM {stream} GROUP BY 1;
    """
    with throwaway_views(pg, schema, [stream], definitions):
        runner = start_runner(stack, group)
        try:
            producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
            for event in (
                {"url": "/a", "ts": "2030-03-01 10:00", "spent": "$1.50"},
                {"url": "/a", "ts": "2030-03-01 11:00", "spent": 2},
                {"url": "/a", "ts": "yesterday at noon", "spent": 1},
            ):
                producer.produce(stream, json.dumps(event).encode())
            assert producer.flush(30) == 0

            def state():
                with pg("sv_owner") as conn:
                    day = conn.execute(f"SELECT n, spent FROM {schema}.per_day").fetchall()
                    dead = conn.execute(
                        "SELECT reason, count FROM ops.dead_letters WHERE group_id = %s", (group,)
                    ).fetchall()
                return day, dead

            wait_for(lambda: state() == ([(2, "$3.50")], [("invalid_input", 1)]), what="two counted, one dead letter")
        finally:
            stop_runner(runner)


def test_a_stream_fed_into_another_must_declare_the_same_types_not_just_types_postgresql_reads(pg, streams):
    target = f"{streams['schema']}_into"
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, f"CREATE STREAM {target} (id bigint, at timestamp) WITH (topic = '{target}')")
        try:
            options = f"topic = '{target}_feed', into = '{target}'"
            with pytest.raises(DefinitionError, match="their types must match"):
                catalog.define(conn, f"CREATE STREAM {target}_feed (id bigint, at interval) WITH ({options})")
        finally:
            catalog.drop(conn, [target], "stream")


def test_a_transform_projects_the_new_types_of_each_event(pg, writer, streams):
    name = f"{streams['schema']}.late"
    definition = (
        f"CREATE CONTINUOUS TRANSFORM {name} AS SELECT g, ts + iv AS due, m * 2 AS doubled, (e)::text AS mood "
        f"FROM {streams['append']} WHERE iv > interval '1 hour'"
    )
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, definition)
    try:
        base = 7_000_000
        events = [
            {"g": base, "ts": "2030-01-01 10:00", "iv": "2 hours", "m": "$1.25", "e": "happy"},
            {"g": base, "ts": "2030-01-01 10:00", "iv": "30 minutes", "m": 3, "e": "sad"},  # filtered out
        ]
        assert apply_events(writer, streams["append"], events) == []
        got = writer.execute(f"SELECT g, due, doubled, mood FROM {name} WHERE g = %s", (base,)).fetchall()
        assert [(g, due.isoformat(), doubled, mood) for g, due, doubled, mood in got] == [
            (base, "2030-01-01T12:00:00", "$2.50", "happy")
        ]
    finally:
        with pg("sv_owner", autocommit=True) as owner:
            catalog.define(owner, f"DROP CONTINUOUS TRANSFORM {name}")
