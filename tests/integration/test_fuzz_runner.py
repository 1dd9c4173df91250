"""No input stops the runner: random and adversarial JSON for every column type, through the real runner.

The records are tests/unit/test_decoding_fuzz.py's (numbers at and past every type's bounds, deep
nesting, NUL and surrogate escapes, invalid UTF-8, wrong types). They go to a stream with a column of
every type and views that aggregate each column, so values the decoder accepts meet PostgreSQL's
aggregates too (a numeric sum past numeric's range, say). The runner stays up, and every record is
either counted or dead-lettered with a reason that is not the runner's bug reason.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import delete_topics, start_runner, stop_runner, throwaway_views, unique, wait_for
from tests.unit.decoding_helpers import Record
from tests.unit.test_decoding_fuzz import DECLARED, records

EXAMPLES, RECORDS = 12, 40  # hypothesis draws each example's records: 12 batches of up to 40


@pytest.fixture(scope="module")
def fuzzed(stack, pg, admin):
    """A stream with a column of every type, views over every column, and a runner of its own group."""
    topic, group, schema = unique("it-fuzz"), unique("it-fuzz"), unique("fuzz")
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    stream = f"{schema}_s"
    definitions = f"""
        CREATE STREAM {stream} ({DECLARED}) WITH (
            topic = '{topic}', consumer_group = '{group}', unknown_fields = 'ignore', max_event_bytes = 200000);
        CREATE CONTINUOUS VIEW {schema}.counts AS SELECT b, count(*) AS n FROM {stream} GROUP BY b;
        CREATE CONTINUOUS VIEW {schema}.numbers AS
            SELECT b, sum(i8) AS i8, sum(i4) AS i4, sum(i2) AS i2, sum(num) AS num, avg(num52) AS num52,
                   sum(f8) AS f8, avg(f4) AS f4, count(DISTINCT u) AS users
            FROM {stream} GROUP BY b;
        CREATE CONTINUOUS VIEW {schema}.texts AS
            SELECT vc, max(t) AS t, min(ts) AS ts, max(d) AS d, count(j) AS j FROM {stream} GROUP BY vc;
    """
    try:
        with throwaway_views(pg, schema, [stream], definitions):
            runner = start_runner(stack, group)
            try:
                yield {"topic": topic, "group": group, "schema": schema, "runner": runner, "sent": [0]}
            finally:
                log = stop_runner(runner)
            assert "undecodable" not in log
    finally:
        delete_topics([topic, f"{topic}.dlq"])


def outcome(pg, fuzzed) -> tuple[int, dict[str, int]]:
    """Records counted by the views, and dead letters by reason, so far."""
    with pg("sv_owner") as conn:
        counted = conn.execute(f"SELECT coalesce(sum(n), 0) FROM {fuzzed['schema']}.counts").fetchone()[0]
        dead = conn.execute("SELECT reason, count FROM ops.dead_letters WHERE group_id = %s", (fuzzed["group"],))
        return int(counted), dict(dead.fetchall())


# Values each column takes, many at the edge of its type, so that records reach the views, where
# sums overflow (1.7e308 twice in double precision, numeric past its 131072 digits) and text and
# jsonb are as long and deep as decoding allows.
VALID = {
    "i8": st.sampled_from([b"9223372036854775807", b"-9223372036854775808", b"0"])
    | st.integers(-(2**63), 2**63 - 1).map(lambda n: str(n).encode()),
    "i4": st.integers(-(2**31), 2**31 - 1).map(lambda n: str(n).encode()),
    "i2": st.integers(-(2**15), 2**15 - 1).map(lambda n: str(n).encode()),
    "num": st.sampled_from([b"9e131071", b"-9e131071", b"1e-16383", b"0.1000000000000000055511151231257827", b"1"]),
    "num52": st.sampled_from([b"999.99", b"-999.99", b"0.01"]),
    "f8": st.sampled_from([b"1.7e308", b"-1.7e308", b"4.9e-324", b"0.1"]),
    "f4": st.sampled_from([b"3.4e38", b"-3.4e38", b"1.4e-45", b"0.5"]),
    "b": st.sampled_from([b"true", b"false", b"null"]),
    "t": st.text(max_size=30).map(lambda t: json.dumps(t).encode()) | st.just(json.dumps("\u00df" * 5000).encode()),
    "vc": st.text(max_size=3).map(lambda t: json.dumps(t).encode()),
    "ts": st.sampled_from([b'"1970-01-01T00:00:00Z"', b'"9999-12-31T23:59:59.999Z"', b"253402300799999"]),
    "d": st.sampled_from([b'"0001-01-01"', b'"9999-12-31"']),
    "u": st.uuids().map(lambda u: f'"{u}"'.encode()),
    "j": st.sampled_from([b"[" * 400 + b"1" + b"]" * 400, b'{"n": 18446744073709551617}', b'"\\u00e9"', b"1e400"]),
}


@st.composite
def plausible(draw) -> Record:
    """A record whose every column is a value its type takes (or absent)."""
    fields = [b'"' + name.encode() + b'":' + draw(values) for name, values in VALID.items() if draw(st.integers(0, 3))]
    return Record(b"{" + b",".join(fields) + b"}")


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(st.lists(plausible() | records("json"), min_size=1, max_size=RECORDS))
def test_adversarial_records_are_each_applied_or_dead_lettered_and_the_runner_stays_up(pg, kafka, fuzzed, batch):
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for record in batch:
        producer.produce(fuzzed["topic"], value=record.value())
    assert producer.flush(30) == 0
    fuzzed["sent"][0] += len(batch)
    sent = fuzzed["sent"][0]

    def settled() -> tuple[int, dict[str, int]] | None:
        counted, dead = outcome(pg, fuzzed)
        return (counted, dead) if counted + sum(dead.values()) >= sent else None

    counted, dead = wait_for(settled, timeout=60, what=f"all {sent} records applied or dead-lettered")
    assert fuzzed["runner"].poll() is None, "the runner exited"
    assert counted + sum(dead.values()) == sent
    assert "undecodable" not in dead
    print(f"{sent} sent: {counted} applied, dead letters by reason {dead}")
